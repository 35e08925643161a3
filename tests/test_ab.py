"""Same-GPU A/B: worktree of a revision, its package under another name, interleaving, verdicts.

The pure parts run on the CPU with temporary git repositories; the end-to-end runs are
``gpu``-marked.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import ab, compare
from harness.batch import QK_DIM, VerifyBatch
from harness.cases import CaseParams
from harness.results import Results, load_results, write_results
from harness.sweep import PlannedCase, PlannedRun, TimingPolicy

PROJECT = Path(__file__).resolve().parents[1]
# Temporary git repositories: git must reach them, whatever GIT_DIR the caller set.
pytestmark = pytest.mark.usefixtures("own_git_repositories")


def git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run(
        ["git", "-C", str(repo), *ident, *args], check=True, capture_output=True, text=True
    ).stdout


def write_package(repo: Path, version: str) -> None:
    """A ``kernel`` package whose ``__init__`` reaches its version through a relative import."""
    pkg = repo / "kernel"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("from .impl import VERSION, where\n")
    (pkg / "impl.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path

            VERSION = {version!r}


            def where():
                return Path(__file__).resolve()
            """
        )
    )


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def two_commit_repo(tmp_path: Path) -> tuple[Path, str, str]:
    """(repo, old sha, new sha): the kernel package's VERSION is "old", then "new"."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_package(repo, "old")
    old = commit_all(repo, "old")
    write_package(repo, "new")
    new = commit_all(repo, "new")
    return repo, old, new


@pytest.fixture
def fresh_modules() -> Iterator[None]:
    """Forget modules a test imports under made-up names."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def worktrees(repo: Path) -> list[str]:
    return [
        line.split()[1]
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


# --- worktree -----------------------------------------------------------------------------------


def test_worktree_commands_detach_at_the_sha_and_force_removal() -> None:
    repo, path = Path("/r/checkout"), Path("/r/checkout-ab-1a2b3c4-x")
    assert ab.worktree_add_command(repo, path, "1a2b3c4d") == [
        "git", "-C", "/r/checkout", "worktree", "add", "--detach", "/r/checkout-ab-1a2b3c4-x", "1a2b3c4d",
    ]  # fmt: skip
    assert ab.worktree_remove_command(repo, path) == [
        "git", "-C", "/r/checkout", "worktree", "remove", "--force", "/r/checkout-ab-1a2b3c4-x",
    ]  # fmt: skip


def test_revision_worktree_checks_out_the_revision_beside_the_checkout_and_removes_it(
    two_commit_repo: tuple[Path, str, str],
) -> None:
    repo, old, _ = two_commit_repo
    with ab.revision_worktree(repo, old) as tree:
        assert tree.parent == repo.parent
        assert tree.name.startswith(f"checkout-ab-{old[:7]}-")
        assert "VERSION = 'old'" in (tree / "kernel" / "impl.py").read_text()
        assert "VERSION = 'new'" in (repo / "kernel" / "impl.py").read_text()
        assert str(tree) in worktrees(repo)
    assert not tree.exists()
    assert worktrees(repo) == [str(repo)]


def test_revision_worktree_is_removed_when_the_run_fails(two_commit_repo: tuple[Path, str, str]) -> None:
    repo, old, _ = two_commit_repo
    with pytest.raises(RuntimeError, match="timing failed"), ab.revision_worktree(repo, old) as tree:
        raise RuntimeError("timing failed")
    assert not tree.exists() and worktrees(repo) == [str(repo)]


def test_revision_worktree_of_an_unknown_sha_says_so_and_leaves_nothing(
    two_commit_repo: tuple[Path, str, str],
) -> None:
    repo, _, _ = two_commit_repo
    with pytest.raises(ab.ABError, match="git worktree add of 0000000"), ab.revision_worktree(repo, "0" * 40):
        pass
    assert sorted(p.name for p in repo.parent.iterdir()) == ["checkout"]


# --- importing a revision's package under another name ----------------------------------------------


def test_import_package_as_resolves_relative_imports_inside_the_worktree(
    two_commit_repo: tuple[Path, str, str], fresh_modules: None
) -> None:
    repo, old, _ = two_commit_repo
    head_kernel = sys.modules.get("kernel")
    with ab.revision_worktree(repo, old) as tree:
        base = ab.import_package_as(f"kernel_base_{old[:7]}", tree / "kernel")
        assert base.VERSION == "old"
        assert base.where() == (tree / "kernel" / "impl.py").resolve()
        assert sys.modules[f"kernel_base_{old[:7]}.impl"].VERSION == "old"
    assert sys.modules.get("kernel") is head_kernel


def test_two_revisions_of_one_package_live_side_by_side(
    two_commit_repo: tuple[Path, str, str], fresh_modules: None
) -> None:
    repo, old, new = two_commit_repo
    with ab.revision_worktree(repo, old) as t_old, ab.revision_worktree(repo, new) as t_new:
        a = ab.import_package_as("pkg_a", t_old / "kernel")
        b = ab.import_package_as("pkg_b", t_new / "kernel")
        assert (a.VERSION, b.VERSION) == ("old", "new")


def test_import_package_as_refuses_a_name_in_use_and_a_folder_without_a_package(
    tmp_path: Path, fresh_modules: None
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    with pytest.raises(ab.ABError, match="already imported"):
        ab.import_package_as("sys", tmp_path / "pkg")
    with pytest.raises(ab.ABError, match="has no __init__.py"):
        ab.import_package_as("pkg_missing", tmp_path)


def test_a_package_that_fails_to_import_leaves_no_half_module(tmp_path: Path, fresh_modules: None) -> None:
    pkg = tmp_path / "kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .impl import VERSION\n")
    (pkg / "impl.py").write_text("raise ImportError('needs a newer torch')\n")
    with pytest.raises(ImportError, match="newer torch"):
        ab.import_package_as("pkg_broken", pkg)
    assert not [k for k in sys.modules if k.startswith("pkg_broken")]


# --- calling a revision's kernel through its own API ------------------------------------------------


def small_batch() -> VerifyBatch:
    g = torch.Generator().manual_seed(0)
    return VerifyBatch(
        q=torch.randn(3, 2, QK_DIM, generator=g).to(torch.bfloat16),
        kv_cache=torch.randn(16, QK_DIM, generator=g).to(torch.bfloat16),
        kv_indices=torch.arange(8, dtype=torch.int32),
        qo_indptr=torch.tensor([0, 3], dtype=torch.int32),
        kv_indptr=torch.tensor([0, 8], dtype=torch.int32),
        prefix_lens=(5,),
        parents=((-1, 0, 0),),
        sm_scale=0.1,
    )


class FakeKernel:
    """Records calls; ``new_api`` adds the keyword-only out/lse/validate of later revisions."""

    def __init__(self, new_api: bool) -> None:
        self.calls: list[dict] = []
        self.packed: list = []
        if new_api:

            def verify_attention(
                q, kv, idx, qo, kvp, tm, tmi, sm_scale, *, out=None, lse=None, validate=True
            ):  # noqa: ANN001, ANN202
                self.calls.append({"out": out, "lse": lse, "validate": validate})
                return out, lse
        else:

            def verify_attention(q, kv, idx, qo, kvp, tm, tmi, sm_scale):  # noqa: ANN001, ANN202
                self.calls.append({})
                return torch.zeros(3, 2, 512), torch.zeros(3, 2)

        self.verify_attention = verify_attention

    def pack_parents(self, parents):  # noqa: ANN001, ANN201
        self.packed.append(parents)
        return torch.zeros(3, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)


def test_kernel_call_validates_once_then_skips_checks_and_reuses_outputs() -> None:
    fake = FakeKernel(new_api=True)
    run = ab.kernel_call(fake, small_batch())
    run()
    run()
    first, second, third = fake.calls
    assert first["validate"] is True and second["validate"] is False and third["validate"] is False
    assert second["out"] is first["out"] and second["out"].shape == (3, 2, 512)
    assert fake.packed == [((-1, 0, 0),)]


def test_what_the_returned_call_did_not_write_is_nan_not_the_validated_calls_output() -> None:
    """Parity checks the buffers after the unvalidated call: a hot path that wrote nothing must
    not pass on the values the validated call left there."""

    def verify_attention(*args, out=None, lse=None, validate=True, config="auto"):  # noqa: ANN001, ANN002, ANN202
        if validate:
            out.fill_(1.0)
            lse.fill_(2.0)
        return out, lse

    fake = FakeKernel(new_api=True)
    fake.verify_attention = verify_attention
    out, lse = ab.kernel_call(fake, small_batch())()
    assert out.isnan().all() and lse.isnan().all()


def test_kernel_call_uses_only_the_eight_arguments_of_an_older_revision() -> None:
    fake = FakeKernel(new_api=False)
    ab.kernel_call(fake, small_batch())()
    assert fake.calls == [{}, {}]


def test_kernel_call_carries_the_config_the_revision_plans_and_nothing_when_it_cannot_say() -> None:
    from harness.registry import impl_config_of

    fake = FakeKernel(new_api=True)
    asked: list[str] = []

    def planned_config(q, kv_indices, qo_indptr, config):  # noqa: ANN001, ANN202
        asked.append(config)
        return "small-m32"

    fake.planned_config = planned_config
    assert impl_config_of(ab.kernel_call(fake, small_batch())) == "small-m32"
    assert asked == ["auto"]
    assert impl_config_of(ab.kernel_call(FakeKernel(new_api=False), small_batch())) == ""


# --- interleaving and verdicts --------------------------------------------------------------------


def test_interleaving_alternates_which_side_goes_first() -> None:
    order: list[str] = []

    def take(label: str) -> list[float]:
        order.append(label)
        return [float(len(order))]

    got = ab.interleaved_samples(["base", "head"], take, rounds=4)
    assert order == ["base", "head", "head", "base", "base", "head", "head", "base"]
    assert got == {"base": [1.0, 4.0, 5.0, 8.0], "head": [2.0, 3.0, 6.0, 7.0]}
    with pytest.raises(ValueError, match="rounds must be >= 2"):
        ab.interleaved_samples(["base", "head"], take, rounds=1)


def test_samples_per_round_gives_each_side_twice_the_grid_minimum() -> None:
    assert ab.samples_per_round(20, 6) * 6 >= 40
    assert ab.samples_per_round(2, 6) == ab.MIN_SAMPLES_PER_ROUND


def side_rows(label: str, median_ms: float, seed: int, mode: str = "cold") -> ab.SideRows:
    rng = np.random.default_rng(seed)
    samples = list(median_ms * (1 + rng.gamma(2.0, 0.002, 48)))
    params = {
        **CaseParams(batch_size=1, prefix_len=65536, num_heads=8, tree_size=16).to_json(),
        "impl": "verify-attn-cuda",
    }
    return ab.SideRows("B1-P65536-T16-H8-shuffled", params, mode, label, samples, 10, 20)


def ab_results(head_ms: float) -> Results:
    rows, notes = ab.ab_rows(
        [(side_rows("base:1111111", 0.1, 1), side_rows("head:2222222", head_ms, 2))], min_change=0.03
    )
    return Results(
        kind="ab",
        created_utc="2025-05-01T00:00:00+00:00",
        command="python -m harness ab --base main --grid quick --impl verify-attn-cuda --rounds 6",
        git={"sha": "2" * 40, "dirty": False},
        environment={"gpu": {"name": "NVIDIA H200"}},
        sweep=rows,
        notes=notes,
    )


def test_ab_rows_put_the_verdict_on_the_head_row_and_in_the_notes(tmp_path: Path) -> None:
    results = ab_results(0.11)
    base, head = results.sweep
    assert (base.impl, head.impl) == ("base:1111111", "head:2222222")
    assert head.note.startswith("SLOWER vs base:1111111")
    assert head.speedup["base:1111111"] == pytest.approx(1 / 1.1, rel=0.01)
    assert base.speedup["head:2222222"] == pytest.approx(1.1, rel=0.01)
    assert results.notes[0].startswith("SLOWER B1-P65536-T16-H8-shuffled cold")
    write_results(results, tmp_path / "results.json")
    assert load_results(tmp_path).sweep[1].note == head.note


def test_split_ab_gives_two_comparable_sides() -> None:
    base, head = ab.split_ab(ab_results(0.11))
    assert (
        {r.impl for r in base.results.sweep} == {r.impl for r in head.results.sweep} == {"verify-attn-cuda"}
    )
    assert (base.sha7, head.sha7) == ("1111111", "2222222")
    c = compare.compare_results(base, head)
    assert [v.verdict for v in c.timing] == [compare.SLOWER]
    assert compare.html_name(c) == "compare-ab-quick-nvidia-h200-1111111-vs-2222222.html"


def test_the_report_writes_results_json_last_and_a_cut_short_one_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = ab_results(0.11)
    whole = tmp_path / "whole"
    comparison = ab.write_report(results, whole, min_change=0.03)
    assert [v.verdict for v in comparison.timing] == [compare.SLOWER]
    assert load_results(whole).sweep == results.sweep
    assert (whole / "index.html").is_file() and list(whole.glob("compare-ab-*.html"))

    def cut(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "write_html", cut)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cut_short = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        ab.write_report(results, cut_short, min_change=0.03)
    assert (cut_short / "index.html").is_file() and not (cut_short / "results.json").exists()
    # the timings are not lost: kept in a folder of their own, and stderr says where
    (kept,) = (tmp_path / "tmp").glob("verify-attention-unwritten-*/results.json")
    assert str(kept) in capsys.readouterr().err and load_results(kept).sweep == results.sweep


@pytest.mark.parametrize(
    ("where", "error", "message"),
    [
        (
            "write_html",
            OSError(28, "No space left on device"),
            r"cannot write the run there \(No space left on device\)",
        ),
        (
            "compare_results",
            ValueError("a comparison bug"),
            r"the run was not written \(ValueError: a comparison bug\)",
        ),
    ],
)
def test_a_report_that_fails_mid_write_keeps_the_results_elsewhere(
    where: str, error: Exception, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(compare, where, fail)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    results = ab_results(0.11)
    with pytest.raises(ab.ABError, match=message) as e:
        ab.write_report(results, tmp_path / "run", min_change=0.03)
    (kept,) = (tmp_path / "tmp").glob("verify-attention-unwritten-*/results.json")
    assert str(kept) in str(e.value) and load_results(kept).sweep == results.sweep


def test_the_default_folder_is_under_the_repository_reports_wherever_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import datetime, timezone

    from harness.results import REPORTS_DIR

    monkeypatch.chdir(tmp_path)
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    path = ab.default_out_dir("quick", "NVIDIA H200", "1111111", "2222222", now)
    assert path == REPORTS_DIR / "20250102T030405-ab-quick-nvidia-h200-1111111-vs-2222222"
    assert path.is_absolute() and REPORTS_DIR == PROJECT / "reports"


def test_a_head_that_breaks_is_a_regression() -> None:
    base_rows = side_rows("base:1111111", 0.1, 1)
    broken = dataclasses.replace(base_rows, impl="head:2222222", samples_ms=[], note="out contains NaN")
    rows, _ = ab.ab_rows([(base_rows, broken)], min_change=0.03)
    assert rows[1].status == "error" and "NO DATA" in rows[1].note
    base, head = ab.split_ab(dataclasses.replace(ab_results(0.1), sweep=rows))
    assert compare.compare_results(base, head).regressions


@pytest.mark.parametrize(
    ("verdicts", "ok"),
    [
        ([compare.SLOWER, compare.SLOWER, compare.NOISY], True),
        ([compare.SLOWER, compare.SAME], False),
        ([compare.SLOWER, compare.FASTER], False),
        ([compare.NOISY, compare.NOISY], False),
    ],
)
def test_slowdown_selfcheck_passes_only_when_the_gate_catches_it(verdicts: list[str], ok: bool) -> None:
    assert ab.slowdown_selfcheck(verdicts)[0] is ok


def test_time_case_times_both_sides_interleaved_and_records_a_broken_side() -> None:
    # On the CPU (host clock) with stand-in kernels: HEAD sleeps 3 ms more per call and adds 0.5.
    case = PlannedCase(
        CaseParams(batch_size=1, prefix_len=64, num_heads=2, tree_size=4),
        (PlannedRun("verify-attn-cuda", ("cold",), TimingPolicy(warmup=1, min_samples=5, max_samples=5)),),
    )

    def fast(batch: VerifyBatch) -> ab.RunFn:
        return lambda: (batch.q[..., :512].float(), None)

    def slow(batch: VerifyBatch) -> ab.RunFn:
        def run() -> tuple[torch.Tensor, None]:
            time.sleep(0.003)
            return batch.q[..., :512].float() + 0.5, None

        return run

    def nan(batch: VerifyBatch) -> ab.RunFn:
        return lambda: (torch.full((4, 2, 512), math.nan), None)

    notes: list[str] = []
    cpu = torch.device("cpu")
    ((base, head),) = ab.time_case(
        case, (ab.Contender("base:1", fast), ab.Contender("head:2", slow)), impl="verify-attn-cuda",
        rounds=2, device=cpu, notes=notes,
    )  # fmt: skip
    assert (base.impl, head.impl, head.case_id, head.params["impl"]) == (
        "base:1", "head:2", "B1-P64-T4-H2-shuffled", "verify-attn-cuda",
    )  # fmt: skip
    assert len(base.samples_ms) == len(head.samples_ms) == 2 * ab.samples_per_round(5, 2)
    # medians, not extremes: this 2-core box may preempt a sample or two
    assert np.median(head.samples_ms) > 3.0 and np.median(base.samples_ms) < 1.0
    rows, _ = ab.ab_rows([(base, head)], min_change=0.03)
    assert rows[1].note.startswith("SLOWER")
    assert notes == ["B1-P64-T4-H2-shuffled: BASE and HEAD outputs differ by up to 0.5"]

    ((base, head),) = ab.time_case(
        case, (ab.Contender("base:1", fast), ab.Contender("head:2", nan)), impl="verify-attn-cuda",
        rounds=2, device=cpu, notes=notes,
    )  # fmt: skip
    assert base.samples_ms and not head.samples_ms
    assert "NaN" in head.note

    calls = {"base:1": 0}

    def fails_later(batch: VerifyBatch) -> ab.RunFn:
        def run() -> tuple[torch.Tensor, None]:
            calls["base:1"] += 1
            if calls["base:1"] > 3:  # the check call passes, timing then fails
                raise RuntimeError("operation not permitted when stream is capturing")
            return batch.q[..., :512].float(), None

        return run

    ((base, head),) = ab.time_case(
        case, (ab.Contender("base:1", fails_later), ab.Contender("head:2", fast)), impl="verify-attn-cuda",
        rounds=2, device=cpu, notes=notes,
    )  # fmt: skip
    assert not base.samples_ms and "cold timing failed: RuntimeError" in base.note
    assert head.samples_ms and not head.note


def test_time_case_rows_name_the_config_each_side_ran() -> None:
    """A side whose prepared call says what it runs (kernel.planned_config through kernel_call)
    carries it into its rows: an A/B of VA_SMALL_SHAPE=48 against the rule reads small /
    small-m32 per case."""
    case = PlannedCase(
        CaseParams(batch_size=1, prefix_len=64, num_heads=2, tree_size=4),
        (PlannedRun("verify-attn-cuda", ("cold",), TimingPolicy(warmup=1, min_samples=5, max_samples=5)),),
    )

    def side(config: str) -> Callable[[VerifyBatch], ab.RunFn]:
        def make(batch: VerifyBatch) -> ab.RunFn:
            def run() -> tuple[torch.Tensor, None]:
                return batch.q[..., :512].float(), None

            if config:
                run.impl_config = config  # type: ignore[attr-defined]
            return run

        return make

    ((base, head),) = ab.time_case(
        case, (ab.Contender("base:1", side("small")), ab.Contender("head:2", side("small-m32"))),
        impl="verify-attn-cuda", rounds=2, device=torch.device("cpu"), notes=[],
    )  # fmt: skip
    rows, _ = ab.ab_rows([(base, head)], min_change=0.03)
    assert [r.impl_config for r in rows] == ["small", "small-m32"]
    ((base, _),) = ab.time_case(
        case, (ab.Contender("base:1", side("")), ab.Contender("head:2", side("small"))),
        impl="verify-attn-cuda", rounds=2, device=torch.device("cpu"), notes=[],
    )  # fmt: skip
    assert base.impl_config == ""


# --- the command ------------------------------------------------------------------------------------


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness")
    ab.register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ab", *argv])
    return args.func(args)


def test_ab_refuses_to_run_without_cuda_and_creates_no_worktree(
    two_commit_repo: tuple[Path, str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo, old, _ = two_commit_repo
    monkeypatch.chdir(repo)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_cli("--base", old) == 2
    assert "needs CUDA" in capsys.readouterr().err
    assert worktrees(repo) == [str(repo)]


def test_ab_needs_exactly_one_of_base_base_define_and_slowdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli() == 2
    assert run_cli("--base", "main", "--slowdown", "1.1") == 2
    assert run_cli("--base", "main", "--base-define", "VA_X") == 2
    assert run_cli("--base-define", "VA_X", "--slowdown", "1.1") == 2
    err = capsys.readouterr().err
    assert "give one of --base REV" in err and "--base-define NAME[=VALUE]" in err


@pytest.mark.parametrize("value", ["", "-DVA_X", "VA X", "1VA", "VA_X=a b", "VA-X"])
def test_ab_base_define_must_be_a_macro(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_cli(f"--base-define={value}")
    assert "--base-define must be a macro NAME or NAME=VALUE" in capsys.readouterr().err


def test_ab_base_define_takes_names_and_values() -> None:
    assert ab.parse_define("VA_X") == "VA_X"
    assert ab.parse_define("VA_COMBINE_POLL_ROUNDS=0") == "VA_COMBINE_POLL_ROUNDS=0"


def test_flags_package_builds_this_kernel_with_extra_flags_beside_the_plain_one(fresh_modules: None) -> None:
    import kernel

    plain = kernel.build.cuda_flags("9.0a")
    copy = ab.flags_package(kernel, ("-DVA_SOME_SWITCH=1",))
    assert copy is not kernel and copy.build is not kernel.build
    assert Path(copy.__file__).resolve() == Path(kernel.__file__).resolve()
    # The copy's nvcc flags end with the extra ones, and so its build name differs; the plain
    # package is untouched.
    assert copy.build.cuda_flags("9.0a") == plain + ("-DVA_SOME_SWITCH=1",)
    assert kernel.build.cuda_flags("9.0a") == plain
    assert copy.build.source_hash("9.0a") != kernel.build.source_hash("9.0a")
    # The same flags give the same module (one build, one name per process).
    assert ab.flags_package(kernel, ("-DVA_SOME_SWITCH=1",)) is copy
    assert ab.flags_package(kernel, ("-DVA_OTHER",)) is not copy


def test_ab_with_base_define_refuses_to_run_without_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_cli("--base-define", "VA_X") == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_ab_refuses_an_out_that_is_a_file_before_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_timing(*args: object, **kwargs: object) -> None:
        raise AssertionError("timed although --out cannot be written")

    monkeypatch.setattr(ab, "flags_package", no_timing)
    monkeypatch.setattr(ab, "exclusive_gpu", no_timing)
    out = tmp_path / "file"
    out.write_text("not a folder")
    assert run_cli("--base-define", "VA_X", "--out", str(out)) == 2
    assert f"ab: --out {out} is a file; expected a folder" in capsys.readouterr().err


CPU_AB_GRID = """
description = "A/B plumbing on the CPU"
[timing]
warmup = 1
min_samples = 3
max_samples = 3
max_time_s = 0.5
[[group]]
name = "kernel"
impls = ["verify-attn-cuda"]
batch_size = [1]
prefix_len = [64]
num_heads = [8]
tree_size = [4]
"""


@pytest.mark.parametrize("broken", ["base", "both", "head"])
def test_an_ab_whose_side_never_ran_exits_2_not_no_regression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], broken: str
) -> None:
    """A BASE switch that does not compile (or a HEAD that fails every call) leaves a side without
    samples: there is no A/B to read, and the exit says so (a bring-up records its ab steps by it)."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ab, "exclusive_gpu", contextlib.nullcontext)
    monkeypatch.setattr(ab, "environment", lambda device: {"gpu": {"name": "FAKE GPU"}})
    real_time_case = ab.time_case
    monkeypatch.setattr(
        ab,
        "time_case",
        lambda case, contenders, **kw: real_time_case(
            case, contenders, **{**kw, "device": torch.device("cpu")}
        ),
    )

    def fake_kernel_call(module: object, batch: object, config: object = None):
        is_base = module.__name__ != "kernel"
        if broken == "both" or (broken == "base") == is_base:
            raise RuntimeError(f"Error building extension {module.__name__!r}")
        q = batch.q[..., :512].float()
        return lambda: (q * 1.0, None)

    monkeypatch.setattr(ab, "kernel_call", fake_kernel_call)
    monkeypatch.setattr(
        ab, "flags_package", lambda module, flags: types.SimpleNamespace(__name__="kernel_flags")
    )
    (tmp_path / "g.toml").write_text(CPU_AB_GRID)
    code = run_cli(
        "--base-define",
        "VA_X",
        "--grid",
        str(tmp_path / "g.toml"),
        "--rounds",
        "2",
        "--out",
        str(tmp_path / "o"),
    )
    assert code == 2
    assert "have no samples on a side" in capsys.readouterr().err
    assert (tmp_path / "o" / "results.json").is_file()  # the run is kept, its rows say why


@pytest.mark.parametrize(("option", "value"), [("--slowdown", "0.9"), ("--rounds", "1")])
def test_ab_rejects_a_bad_option_value_naming_it(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        run_cli("--slowdown", "1.1", option, value)
    assert f"{option} must be" in capsys.readouterr().err


# --- on a GPU -------------------------------------------------------------------------------------------

TINY_GRID = """
description = "A/B end-to-end test: two kernel cases"
[timing]
warmup = 3
min_samples = 12
max_samples = 12
max_time_s = 1.0
[[group]]
name = "kernel"
impls = ["verify-attn-cuda"]
batch_size = [1]
prefix_len = [16384, 65536]
num_heads = [16]
tree_size = [16]
"""


@pytest.mark.gpu
def test_slowdown_selfcheck_catches_a_ten_percent_regression_on_the_gpu(tmp_path: Path) -> None:
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY_GRID)
    out = tmp_path / "out"
    code = subprocess.run(
        [sys.executable, "-m", "harness", "ab", "--slowdown", "1.10", "--grid", str(grid), "--out", str(out)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert code.returncode == 0, code.stdout + code.stderr
    rows = load_results(out).sweep
    assert {r.impl.split("+")[0].split(":")[0] for r in rows} == {"base", "head"}
    assert list(out.glob("compare-ab-*.html"))


@pytest.mark.gpu
def test_ab_against_a_build_with_an_unused_flag_finds_no_regression(tmp_path: Path) -> None:
    # A/A through the flags path: a macro no source reads, so the two builds differ only by name.
    (tmp_path / "tiny.toml").write_text(TINY_GRID)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "ab", "--base-define", "VA_AB_UNUSED_SWITCH"]
        + ["--grid", str(tmp_path / "tiny.toml"), "--out", str(out)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = load_results(out).sweep
    assert {r.impl.split(":")[0] for r in rows} == {"base", "head"}
    # both kernels ran every case: an A/B where a side failed has no verdict to vouch for
    assert all(r.status == "ok" and len(r.samples_ms) >= 2 for r in rows), [(r.impl, r.note) for r in rows]
    assert any("VA_AB_UNUSED_SWITCH" in r.impl for r in rows if r.impl.startswith("base:"))
    verdicts = {r.note.split(" ")[0] for r in rows if r.impl.startswith("head:")}
    assert compare.SLOWER not in verdicts and compare.FASTER not in verdicts


@pytest.mark.gpu
def test_ab_of_an_unchanged_kernel_against_its_commit_finds_no_regression(tmp_path: Path) -> None:
    # A/A through the real worktree path: a repository holding a copy of this harness and kernel,
    # committed; --base is resolved in the repository of the harness that runs.
    repo = tmp_path / "checkout"
    for part in ("kernel", "harness"):
        shutil.copytree(PROJECT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q", "-b", "main")
    sha = commit_all(repo, "harness and kernel")
    (tmp_path / "tiny.toml").write_text(TINY_GRID)
    done = subprocess.run(
        [sys.executable, "-m", "harness", "ab", "--base", sha, "--grid", str(tmp_path / "tiny.toml")]
        + ["--out", str(tmp_path / "out")],
        cwd=repo,
        env=dict(os.environ),  # the copy's harness comes first on sys.path (the working folder)
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = load_results(tmp_path / "out").sweep
    assert all(r.status == "ok" and len(r.samples_ms) >= 2 for r in rows), [(r.impl, r.note) for r in rows]
    assert {r.impl.split("+")[0] for r in rows} == {
        f"base:{sha[:7]}",
        f"head:{sha[:7]}",
    }  # one commit, two builds
    verdicts = {r.note.split(" ")[0] for r in rows if r.impl.startswith("head:")}
    assert compare.SLOWER not in verdicts and compare.FASTER not in verdicts
    assert worktrees(repo) == [str(repo)]


def test_an_empty_out_is_refused_not_taken_for_the_current_folder(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main as cli_main

    with pytest.raises(SystemExit) as e:
        cli_main(["ab", "--base-define", "VA_X", "--out", ""])
    assert e.value.code == 2 and "argument --out: expected the run's folder" in capsys.readouterr().err
