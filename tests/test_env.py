"""What a run records as its commit (harness/env.py git_info)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import env


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_this_checkout_records_its_own_head() -> None:
    if not (env.REPO_ROOT / ".git").exists():
        pytest.skip("this copy of the tree is not a git checkout")
    info = env.git_info()
    assert info["source"] == "git" and info["sha"] == _git(env.REPO_ROOT, "rev-parse", "HEAD")


def test_a_source_copy_inside_another_repository_records_the_commit_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Git answers for the repository around the copy, whose HEAD is not the copy's commit: the
    copy's VERIFY_ATTN_GIT_SHA is what its runs are labelled with."""
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "f").write_text("x")
    _git(outer, "add", "f")
    _git(outer, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "outer")
    copy = outer / "sub" / "verify-attention"
    copy.mkdir(parents=True)
    monkeypatch.setattr(env, "REPO_ROOT", copy.resolve())
    monkeypatch.setenv("VERIFY_ATTN_GIT_SHA", "024f546" + "0" * 33)
    monkeypatch.setenv("VERIFY_ATTN_GIT_DIRTY", "1")
    info = env.git_info()
    assert info["sha"] == "024f546" + "0" * 33 and info["dirty"] is True and info["source"] == "env"
    assert "git_error" not in info


def test_a_git_that_fails_for_another_reason_is_named_in_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho \"fatal: detected dubious ownership in repository at '/x'\" >&2\nexit 128\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("git") == str(fake)
    monkeypatch.delenv("VERIFY_ATTN_GIT_SHA", raising=False)
    info = env.git_info()
    assert info["sha"] is None and "dubious ownership" in info["git_error"]
    assert "the run's commit is unknown" in capsys.readouterr().err


def test_sigterm_and_sighup_take_the_path_of_ctrl_c_in_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job system's SIGTERM or a closed terminal's SIGHUP must run a command's Ctrl-C clean-up
    (stop workers, remove a worktree, record a bring-up's step), not kill it with its children
    left running."""
    import argparse
    import signal

    from harness import cli

    for sig in (signal.SIGTERM, signal.SIGHUP):
        cleaned: list[bool] = []

        def command(
            args: argparse.Namespace, sig: signal.Signals = sig, cleaned: list[bool] = cleaned
        ) -> int:
            try:
                os.kill(os.getpid(), sig)
                return 0  # not reached: the signal interrupts
            finally:
                cleaned.append(True)

        parser = argparse.ArgumentParser()
        parser.set_defaults(func=command)
        monkeypatch.setattr(cli, "build_parser", lambda parser=parser: parser)
        before = signal.getsignal(sig)
        assert cli.main([]) == 130 and cleaned == [True]
        assert signal.getsignal(sig) is before  # restored after the command
