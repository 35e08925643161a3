"""JIT build naming: arch list (9.0 -> 9.0a for the wgmma kernel), flags and the cache hash."""

from __future__ import annotations

import pytest

from kernel import build


@pytest.mark.parametrize(
    ("archs", "expected"),
    [
        ("9.0", "9.0a"),
        ("9.0;12.0", "9.0a;12.0"),
        (" 8.0 ; 9.0 ", "8.0;9.0a"),
        ("9.0a", "9.0a"),
        ("12.0", "12.0"),
        ("9.0+PTX", "9.0+PTX"),
        ("9.0 12.0", "9.0a;12.0"),  # torch splits TORCH_CUDA_ARCH_LIST on spaces too
        ("9.0a+PTX;12.0", "9.0a+PTX;12.0"),
    ],
)
def test_sm90_is_built_arch_specific(archs: str, expected: str) -> None:
    assert build.with_sm90a(archs) == expected


def test_the_wgmma_define_follows_the_arch_list() -> None:
    assert "-DVA_HAVE_SM90A" in build.cuda_flags("9.0a;12.0")
    assert "-DVA_HAVE_SM90A" not in build.cuda_flags("12.0")
    assert "-DVA_HAVE_SM90A" not in build.cuda_flags("8.0;9.0+PTX")
    assert "-DVA_HAVE_SM90A" in build.cuda_flags("9.0a+PTX;12.0")


@pytest.mark.parametrize("archs", ["Hopper;12.0", "sm_90", "9", "", " ; "])
def test_an_arch_list_entry_that_is_not_a_compute_capability_is_refused_by_name(archs: str) -> None:
    with pytest.raises(ValueError, match="VERIFY_ATTN_ARCHS"):
        build.with_sm90a(archs)


def test_a_stale_build_lock_is_removed_and_a_held_one_is_an_error_naming_it(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import time

    lock = tmp_path / "lock"
    lock.write_text("")
    old = time.time() - build.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    build.wait_for_build_lock(tmp_path)
    assert not lock.exists() and "removing" in capsys.readouterr().err
    lock.write_text("")  # fresh: another process's build, which does not end here
    with pytest.raises(RuntimeError, match=f"{lock} is still held after 0 s"):
        build.wait_for_build_lock(tmp_path, wait_s=0)
    assert lock.exists()
    build.wait_for_build_lock(tmp_path / "elsewhere")  # no lock: returns at once


HOLD_FLOCK = """
import fcntl, sys, time
fh = open(sys.argv[1], "a")
fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(
    build.fcntl is None, reason="flock(2) is POSIX only; elsewhere the age rule above applies"
)
def test_a_dead_builds_lock_is_removed_at_once_and_a_live_build_is_waited_for_by_name(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed build leaves torch's lock file, fresh: the next build removes it at once (the age
    rule would have waited up to 15 minutes), because no live process holds this package's own
    lock. A build that is alive (another process holding it) is waited for, and named if it
    outlasts the wait; it dies, and the lock is free again."""
    import subprocess
    import sys

    torch_lock = tmp_path / "lock"
    torch_lock.write_text("")  # fresh mtime: what a build killed a moment ago leaves
    entered = []
    with build.build_lock(tmp_path):
        entered.append(True)
        assert not torch_lock.exists()
    assert entered and "left by a build that did not finish" in capsys.readouterr().err

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_FLOCK, str(tmp_path / build.OWN_LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        torch_lock.write_text("")  # the live build's own torch lock: must be left alone
        with pytest.raises(RuntimeError, match=f"building the extension in {tmp_path} for over 0 s"):
            with build.build_lock(tmp_path, wait_s=0):
                pass
        assert torch_lock.exists()
    finally:
        holder.kill()
        holder.wait()
    with build.build_lock(tmp_path, wait_s=5):  # the holder is dead: the OS released its lock
        assert not torch_lock.exists()


def test_without_flock_the_age_rule_decides(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without flock(2) (the call raises OSError): a fresh torch lock is a live
    build's, waited for and named, as before the package's own lock existed."""

    def no_flock(fh) -> bool:
        raise OSError(37, "No locks available")

    monkeypatch.setattr(build, "_try_flock", no_flock)
    lock = tmp_path / "lock"
    lock.write_text("")
    with pytest.raises(RuntimeError, match=f"{lock} is still held after 0 s"):
        with build.build_lock(tmp_path, wait_s=0):
            pass
    assert lock.exists()


def test_env_archs_are_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIFY_ATTN_ARCHS", "9.0;12.0")
    assert build.target_archs() == "9.0a;12.0"


def test_the_hash_separates_arch_lists_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERIFY_ATTN_EXTRA_CUDA_FLAGS", raising=False)
    a, b = build.source_hash("9.0a"), build.source_hash("12.0")
    assert a != b and a == build.source_hash("9.0a")
    monkeypatch.setenv("VERIFY_ATTN_EXTRA_CUDA_FLAGS", "-DVA_WS_BLOCK_N=32")
    assert build.source_hash("9.0a") != a


def test_every_header_is_hashed_and_shipped() -> None:
    """A header left out of HEADERS would leave stale builds in the cache after an edit."""
    on_disk = {p.name for p in build.CSRC.iterdir() if p.suffix in (".h", ".cuh")}
    assert on_disk == set(build.HEADERS)


def test_the_loaded_build_records_its_archs_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run's environment records is what the extension was built with (the sm_90a define
    included), taken at load time rather than recomputed."""
    seen = {}

    def fake_load(name, sources, archs, cuda_cflags, cflags=None, verbose=False):
        seen.update(name=name, archs=archs, flags=cuda_cflags)
        return object()

    monkeypatch.setenv("VERIFY_ATTN_ARCHS", "9.0;12.0")
    monkeypatch.delenv("VERIFY_ATTN_EXTRA_CUDA_FLAGS", raising=False)
    monkeypatch.setattr(build, "load_cuda_extension", fake_load)
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "_loaded_build", None)
    assert build.loaded_build() is None
    build.load_extension()
    assert seen["archs"] == "9.0a;12.0" and seen["name"].startswith("verify_attention_")
    assert build.loaded_build() == {
        "target_archs": "9.0a;12.0",
        "cuda_flags": seen["flags"],
        "tuning": ["VERIFY_ATTN_ARCHS=9.0a;12.0"],  # not this machine's default build (it has no GPU)
    }
    assert "-DVA_HAVE_SM90A" in build.loaded_build()["cuda_flags"]


def test_a_default_build_records_no_tuning_and_extra_flags_are_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VERIFY_ATTN_ARCHS", raising=False)
    monkeypatch.delenv("VERIFY_ATTN_EXTRA_CUDA_FLAGS", raising=False)
    assert build.tuning() == []
    monkeypatch.setenv("VERIFY_ATTN_EXTRA_CUDA_FLAGS", "-DVA_WS_BLOCK_N=32  -G")
    assert build.tuning() == ["-DVA_WS_BLOCK_N=32", "-G"]
