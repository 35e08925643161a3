"""Compare: noise-aware timing verdicts, parity regressions, run resolution and the HTML diff."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from harness import compare
from harness.cases import CaseParams
from harness.results import ParityRow, Results, SweepRow, compress_results, write_results

# Temporary git repositories: git must reach them, whatever GIT_DIR the caller set.
pytestmark = pytest.mark.usefixtures("own_git_repositories")

H200 = "NVIDIA H200"


def timings(median_ms: float, *, seed: int, n: int = 60, rel_noise: float = 0.004) -> list[float]:
    """Right-skewed samples like GPU timings (a floor plus gamma noise of mean ``rel_noise``),
    rounded to 4 significant digits as results.json stores them."""
    rng = np.random.default_rng(seed)
    x = median_ms * (1.0 + rng.gamma(2.0, rel_noise / 2.0, n))
    return [float(f"{v:.4g}") for v in x]


# A case's params, as every results file's sweep rows carry them (SWEEP_PARAMS_REQUIRED).
PARAMS = CaseParams(batch_size=1, prefix_len=1024, num_heads=8, tree_size=16, tree="eagle").to_json()


def sweep_row(
    case_id: str, samples: Sequence[float], *, impl: str = "verify-attn-cuda", throttled: bool = False
):
    s = sorted(samples)
    return SweepRow(
        case_id=case_id,
        impl=impl,
        params=PARAMS,
        mode="cold",
        samples_ms=list(samples),
        median_ms=float(np.median(s)),
        iqr_ms=float(np.percentile(s, 75) - np.percentile(s, 25)),
        min_ms=s[0],
        max_ms=s[-1],
        bytes=1,
        flops=1,
        throttled=throttled,
    )


def parity_row(bundle: str, status: str, *, impl: str = "verify-attn-cuda", **kw) -> ParityRow:
    return ParityRow(bundle=bundle, impl=impl, status=status, **kw)


def make_results(
    sweep: dict[str, Sequence[float]] | None = None,
    *,
    parity: Sequence[ParityRow] = (),
    gpu: str | None = H200,
    kind: str = "sweep",
    grid: str = "quick",
    sha: str = "a" * 40,
    created: str = "2025-03-01T12:00:00+00:00",
) -> Results:
    command = f"python -m harness sweep --grid {grid}" if kind == "sweep" else "python -m harness parity"
    return Results(
        kind=kind,
        created_utc=created,
        command=command,
        git={"sha": sha, "dirty": False},
        environment={"gpu": {"name": gpu} if gpu else None, "torch": "2.11.0"},
        sweep=[sweep_row(cid, s) for cid, s in (sweep or {}).items()],
        parity=list(parity),
    )


def one_case(median_ms: float, *, seed: int, **kwargs: object) -> Results:
    """A run of the one case "c", timed around ``median_ms`` (``make_results``'s keywords)."""
    return make_results({"c": timings(median_ms, seed=seed)}, **kwargs)  # type: ignore[arg-type]


def save(results: Results, folder: Path) -> Path:
    path = folder / "results.json"
    write_results(results, path)
    return path


def run_cli(*argv: str) -> int:
    """``python -m harness compare ...`` through the module's own parser (no other command loaded)."""
    parser = argparse.ArgumentParser(prog="python -m harness")
    compare.register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["compare", *argv])
    return args.func(args)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "html"


# --- statistics -------------------------------------------------------------------------------


def test_mann_whitney_u_counts_pairs_where_head_is_larger_with_half_ties() -> None:
    base, head = [1.0, 2.0, 2.0, 5.0], [2.0, 3.0, 6.0]
    pairs = sum((h > b) + 0.5 * (h == b) for b in base for h in head)
    u, _ = compare.mann_whitney_u(base, head)
    assert u == pytest.approx(pairs)


def test_mann_whitney_tie_corrected_variance_equals_the_exact_permutation_variance() -> None:
    # Under the null every split of the pooled values is equally likely; the tie-corrected
    # normal approximation must use exactly the variance of U over those splits.
    pooled = [1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 5.0]
    n1 = 4
    us = []
    for idx in itertools.combinations(range(len(pooled)), n1):
        base = [pooled[i] for i in idx]
        head = [pooled[i] for i in range(len(pooled)) if i not in idx]
        us.append(compare.mann_whitney_u(base, head)[0])
    exact_var = float(np.var(us))
    n2, n = len(pooled) - n1, len(pooled)
    _, counts = np.unique(pooled, return_counts=True)
    formula = n1 * n2 / 12 * ((n + 1) - float((counts**3 - counts).sum()) / (n * (n - 1)))
    assert exact_var == pytest.approx(formula)
    # and the p value follows from it: z = (|U - mu| - 0.5) / sd
    u, p = compare.mann_whitney_u(pooled[:4], pooled[4:])
    z = (abs(u - n1 * n2 / 2) - 0.5) / formula**0.5
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)))


def test_mann_whitney_p_is_one_when_all_samples_are_equal() -> None:
    assert compare.mann_whitney_u([2.0] * 5, [2.0] * 7)[1] == 1.0


def test_six_separated_samples_per_side_reach_alpha_approximated_and_five_do_not() -> None:
    # The normal approximation (with the continuity correction) overstates p for small samples.
    assert compare.mann_whitney_u(range(6), range(10, 16))[1] < compare.ALPHA
    assert compare.mann_whitney_u(range(5), range(10, 15))[1] > compare.ALPHA
    assert compare.MIN_SAMPLES == 6


@pytest.mark.parametrize(
    ("n_base", "n_head", "exact"),
    [(5, 5, 2 / 252), (10, 3, 2 / 286), (15, 5, 2 / 15504), (3, 3, 2 / 20), (4, 4, 2 / 70)],
)
def test_completely_separated_samples_get_the_exact_permutation_p(
    n_base: int, n_head: int, exact: float
) -> None:
    assert compare.separated_p(list(range(n_base)), list(range(100, 100 + n_head))) == pytest.approx(exact)
    assert compare.separated_p(list(range(100, 100 + n_base)), list(range(n_head))) == pytest.approx(exact)
    assert compare.separated_p([1.0, 2.0], [2.0, 3.0]) is None  # touching: not separated


@pytest.mark.parametrize(("factor", "n_head"), [(3, 9), (5, 5), (10, 3)])
def test_a_large_slowdown_with_the_few_samples_a_slow_call_gets_is_slower(factor: float, n_head: int) -> None:
    """The sweep's one-second budget gives a call 5x slower 5 samples and one 10x slower 3
    (timing.sample_budget): the worst regressions have the fewest samples, and must still gate."""
    base = [34.0 * (1 + 0.002 * i) for i in range(15)]
    head = [34.0 * factor * (1 + 0.002 * i) for i in range(n_head)]
    d = compare.timing_decision(base, head)
    assert (d.verdict, d.regression) == (compare.SLOWER, True), d.reason
    assert d.p_value < compare.ALPHA


# --- timing verdicts ----------------------------------------------------------------------------


def test_identical_samples_are_same() -> None:
    s = timings(0.5, seed=1)
    d = compare.timing_decision(s, list(s))
    assert (d.verdict, d.regression) == (compare.SAME, False)


def test_ten_percent_slower_with_tight_spread_is_slower_and_a_regression() -> None:
    d = compare.timing_decision(timings(0.5, seed=1), timings(0.55, seed=2))
    assert (d.verdict, d.regression) == (compare.SLOWER, True)
    assert d.change == pytest.approx(0.10, abs=0.01)


def test_ten_percent_faster_is_faster_and_not_a_regression() -> None:
    d = compare.timing_decision(timings(0.5, seed=1), timings(0.45, seed=2))
    assert (d.verdict, d.regression) == (compare.FASTER, False)


def test_overlapping_wide_samples_are_noisy() -> None:
    d = compare.timing_decision(timings(0.5, seed=1, rel_noise=0.1), timings(0.52, seed=2, rel_noise=0.1))
    assert (d.verdict, d.regression) == (compare.NOISY, False)
    assert "spread" in d.reason


def test_a_separated_shift_below_the_minimum_effect_is_same() -> None:
    # 1.5 % run-to-run drift with tight samples: the samples separate, but it is not a regression.
    d = compare.timing_decision(
        timings(0.5, seed=1, rel_noise=0.002), timings(0.5075, seed=2, rel_noise=0.002)
    )
    assert d.p_value is not None and d.p_value < compare.ALPHA
    assert d.verdict == compare.SAME


def test_min_change_option_moves_the_threshold() -> None:
    base, head = timings(0.5, seed=1), timings(0.55, seed=2)
    assert compare.timing_decision(base, head, min_change=0.15).verdict == compare.SAME


def test_disjoint_intervals_without_a_significant_rank_test_are_not_slower() -> None:
    # HEAD's min is above BASE's q3 and the median is 30 % up, but a quarter of BASE is slower
    # than all of HEAD: the rank test (p ~ 0.07) does not back the interval condition.
    base, head = [1.0] * 6 + [2.0, 2.0], [1.3] * 8
    d = compare.timing_decision(base, head)
    assert min(head) > compare.sample_stats(base).q3_ms and d.change == pytest.approx(0.3)
    assert d.p_value is not None and d.p_value > compare.ALPHA
    assert d.verdict == compare.NOISY


def test_too_few_samples_to_separate_are_noisy_even_when_far_apart() -> None:
    # Three a side separate by chance one time in ten (p = 2 / C(6, 3)).
    d = compare.timing_decision([1.0, 1.01, 1.02], [2.0, 2.01, 2.02])
    assert d.verdict == compare.NOISY and d.p_value == pytest.approx(0.1)


def test_too_few_samples_never_read_same() -> None:
    d = compare.timing_decision([1.0, 1.001, 1.002, 1.0, 1.001], [1.0, 1.001, 1.002, 1.001, 1.0])
    assert d.verdict == compare.NOISY
    assert "too few samples to call SAME (5 vs 5, need 6)" in d.reason


def test_a_sample_of_zero_is_left_out_not_the_whole_row() -> None:
    base, head = timings(0.5, seed=1), timings(0.55, seed=2)
    d = compare.timing_decision(base, [0.0, *head])
    assert (d.verdict, d.regression) == (compare.SLOWER, True)
    assert "(1 samples not finite and positive left out)" in d.reason
    assert d.head.n == len(head)
    d = compare.timing_decision([0.0, *base], head)
    assert d.verdict == compare.SLOWER and d.base.n == len(base)


def test_head_without_samples_is_no_data_and_a_regression() -> None:
    d = compare.timing_decision(timings(0.5, seed=1), [])
    assert (d.verdict, d.regression) == (compare.NO_DATA, True)
    assert compare.timing_decision([], []).regression is False


def test_a_few_slow_outliers_in_head_do_not_make_it_slower() -> None:
    head = timings(0.5, seed=2)
    head[:5] = [0.7] * 5
    assert compare.timing_decision(timings(0.5, seed=1), head).verdict == compare.SAME


def test_a_few_fast_outliers_in_base_do_not_hide_a_ten_percent_slowdown() -> None:
    """A board near its power cap runs some samples ~10 % fast (37122e8's P=262k H=128 T=64: 4 of
    40); the quartiles, not the fastest sample, decide."""
    base = timings(0.5, seed=1, n=40)
    base[:4] = [0.45] * 4
    head = [round(x * 1.10, 6) for x in base]
    d = compare.timing_decision(base, head)
    assert (d.verdict, d.regression) == (compare.SLOWER, True)


def test_swapping_the_sides_swaps_slower_and_faster() -> None:
    base = timings(0.5, seed=3, n=40, rel_noise=0.001)
    head = [x * 1.0305 for x in base]
    assert compare.timing_decision(base, head).verdict == compare.SLOWER
    assert compare.timing_decision(head, base).verdict == compare.FASTER
    # Inside the bound both ways: 2.9 % slower is 2.8 % faster the other way round.
    head = [x * 1.029 for x in base]
    assert compare.timing_decision(base, head).verdict == compare.SAME
    assert compare.timing_decision(head, base).verdict == compare.SAME


def test_no_false_alarm_over_many_seeds_and_every_ten_percent_slowdown_caught() -> None:
    verdicts_same = {
        compare.timing_decision(timings(0.5, seed=s), timings(0.5 * 1.01, seed=s + 1000)).verdict
        for s in range(150)
    }
    assert compare.SLOWER not in verdicts_same and compare.FASTER not in verdicts_same
    verdicts_slow = {
        compare.timing_decision(timings(0.5, seed=s, n=20), timings(0.55, seed=s + 1000, n=20)).verdict
        for s in range(150)
    }
    assert verdicts_slow == {compare.SLOWER}


# --- parity verdicts ----------------------------------------------------------------------------


def test_parity_pass_to_fail_is_a_regression() -> None:
    v = compare.parity_verdict(parity_row("smoke", "pass"), parity_row("smoke", "fail", reason="rel err 0.2"))
    assert (v.verdict, v.regression) == (compare.REGRESSED, True)


@pytest.mark.parametrize("name", ["tokens_match", "path_match"])
def test_parity_tokens_or_path_mismatch_counts_even_if_status_says_pass(name: str) -> None:
    v = compare.parity_verdict(
        parity_row("smoke", "pass", **{name: True}), parity_row("smoke", "pass", **{name: False})
    )
    assert (v.verdict, v.regression, v.reason) == (compare.REGRESSED, True, f"{name} became False")
    # already False in BASE: no new regression
    assert not compare.parity_verdict(
        parity_row("smoke", "pass", **{name: False}), parity_row("smoke", "pass", **{name: False})
    ).regression


def test_mutation_control_that_starts_passing_is_a_regression() -> None:
    mutant = "mutant:causal"
    v = compare.parity_verdict(
        parity_row("smoke", "fail", impl=mutant), parity_row("smoke", "pass", impl=mutant)
    )
    assert v.regression
    assert not compare.parity_verdict(
        parity_row("smoke", "fail", impl=mutant), parity_row("smoke", "fail", impl=mutant)
    ).regression


def test_a_mutant_that_errs_is_not_caught() -> None:
    """As ``nox -s parity`` counts it: only a failing mutant was caught; one that errs showed nothing."""
    mutant = "mutant:causal"
    v = compare.parity_verdict(
        parity_row("smoke", "fail", impl=mutant), parity_row("smoke", "error", impl=mutant, reason="boom")
    )
    assert (v.verdict, v.regression) == (compare.REGRESSED, True)
    assert "boom" in v.reason
    rows = [parity_row("smoke", "error", impl=mutant), parity_row("ragged", "error", impl=mutant)]
    assert compare.mutants_caught_nowhere(rows) == {mutant}


def test_a_mutant_new_in_head_may_pass_on_a_bundle_that_cannot_show_it() -> None:
    """A run with --mutations against one without: the causal-mask mutant passes on a bundle whose
    tree is a chain and fails elsewhere, which is what DESIGN asks (one bundle at least)."""
    mutant = "mutant:causal-mask"
    base = make_results(kind="parity", parity=[parity_row("smoke", "pass"), parity_row("ragged", "pass")])
    head = make_results(
        kind="parity",
        parity=[
            parity_row("smoke", "pass"),
            parity_row("ragged", "pass"),
            parity_row("smoke", "pass", impl=mutant),
            parity_row("ragged", "fail", impl=mutant),
        ],
    )
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert not any(v.regression for v in c.parity)
    assert {(v.bundle, v.verdict) for v in c.parity if v.impl == mutant} == {
        ("smoke", compare.HEAD_ONLY),
        ("ragged", compare.HEAD_ONLY),
    }


def test_a_mutant_caught_on_no_bundle_is_a_regression_even_without_a_base_row() -> None:
    mutant = "mutant:wrong-sm-scale"
    base = make_results(kind="parity", parity=[parity_row("smoke", "pass")])
    head = make_results(
        kind="parity",
        parity=[
            parity_row("smoke", "pass"),
            parity_row("smoke", "pass", impl=mutant),
            parity_row("ragged", "pass", impl=mutant),
        ],
    )
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    bad = [v for v in c.parity if v.regression]
    assert {(v.bundle, v.impl) for v in bad} == {("smoke", mutant), ("ragged", mutant)}
    assert all("caught on no bundle" in v.reason for v in bad)


def test_parity_pass_to_unavailable_is_listed_but_does_not_gate() -> None:
    v = compare.parity_verdict(
        parity_row("smoke", "pass"), parity_row("smoke", "unavailable", reason="sglang is not installed")
    )
    assert (v.verdict, v.regression) == (compare.UNAVAILABLE, False)
    assert "sglang is not installed" in v.reason


def test_a_new_failing_parity_row_is_a_regression() -> None:
    assert compare.parity_verdict(None, parity_row("ragged", "error", reason="boom")).regression


# --- the command ----------------------------------------------------------------------------------


def test_cli_identical_runs_exit_0(tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = make_results({"B1-P1000-T4-H8-shuffled": timings(0.1, seed=1)})
    assert run_cli(str(save(r, tmp_path / "a")), str(save(r, tmp_path / "b")), "--out", str(out_dir)) == 0
    assert "SAME 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("head_ms", "noise", "verdict", "code"),
    [(0.11, 0.004, "SLOWER", 1), (0.09, 0.004, "FASTER", 0), (0.104, 0.1, "NOISY", 0)],
)
def test_cli_exit_code_follows_the_verdict(
    tmp_path: Path,
    out_dir: Path,
    capsys: pytest.CaptureFixture[str],
    head_ms: float,
    noise: float,
    verdict: str,
    code: int,
) -> None:
    base = make_results({"c": timings(0.1, seed=1, rel_noise=noise)}, sha="a" * 40)
    head = make_results({"c": timings(head_ms, seed=2, rel_noise=noise)}, sha="b" * 40)
    assert (
        run_cli(str(save(base, tmp_path / "a")), str(save(head, tmp_path / "b")), "--out", str(out_dir))
        == code
    )
    assert f"{verdict} 1" in capsys.readouterr().out


def test_a_head_with_no_rows_at_all_vouches_for_nothing(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty HEAD (a run that timed nothing) would otherwise list every row BASE ONLY and pass."""
    base = make_results({"c": timings(0.1, seed=1), "d": timings(0.2, seed=2)})
    head = make_results({}, sha="b" * 40)
    assert (
        run_cli(str(save(base, tmp_path / "a")), str(save(head, tmp_path / "b")), "--out", str(out_dir)) == 1
    )
    out = capsys.readouterr().out
    assert "NO DATA 2" in out and "HEAD has no timed rows" in out
    base = make_results(kind="parity", parity=[parity_row("smoke", "pass")])
    head = make_results(kind="parity", sha="b" * 40)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert [(v.verdict, v.regression) for v in c.parity] == [(compare.REGRESSED, True)]


def test_cli_parity_regression_exits_1(tmp_path: Path, out_dir: Path) -> None:
    base = make_results(parity=[parity_row("smoke", "pass")])
    head = make_results(parity=[parity_row("smoke", "fail", reason="rel err 0.3")], sha="b" * 40)
    assert (
        run_cli(str(save(base, tmp_path / "a")), str(save(head, tmp_path / "b")), "--out", str(out_dir)) == 1
    )


def test_cli_lists_cases_present_on_one_side_only(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = make_results({"kept": timings(0.1, seed=1), "dropped": timings(0.2, seed=3)})
    head = make_results({"kept": timings(0.1, seed=2), "added": timings(0.3, seed=4)}, sha="b" * 40)
    assert (
        run_cli(str(save(base, tmp_path / "a")), str(save(head, tmp_path / "b")), "--out", str(out_dir)) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("BASE ONLY") and "dropped" in line for line in lines)
    assert any(line.startswith("HEAD ONLY") and "added" in line for line in lines)


def test_cli_refuses_different_gpu_models_without_force(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = save(one_case(0.1, seed=1, gpu=H200), tmp_path / "a")
    head = save(one_case(0.2, seed=2, gpu="NVIDIA GeForce RTX 5090"), tmp_path / "b")
    assert run_cli(str(base), str(head), "--out", str(out_dir)) == 2
    err = capsys.readouterr().err
    assert H200 in err and "RTX 5090" in err and "--force" in err
    assert run_cli(str(base), str(head), "--out", str(out_dir), "--force") == 1


def test_cpu_parity_runs_compare_parity_only(tmp_path: Path) -> None:
    base = make_results(
        {"c": timings(0.1, seed=1)}, gpu=None, parity=[parity_row("smoke", "pass", impl="oracle")]
    )
    head = make_results(
        {"c": timings(0.5, seed=2)}, gpu=None, parity=[parity_row("smoke", "pass", impl="oracle")]
    )
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert c.timing == () and [v.verdict for v in c.parity] == [compare.SAME]
    assert any("parity only" in n for n in c.notes)


def test_two_cpu_sweeps_are_refused_saying_timings_are_compared_between_gpu_runs_only(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both time case c, so "no case in common" alone would mislead: the reason is said."""
    a = str(save(make_results({"c": timings(0.1, seed=1)}, gpu=None), tmp_path / "a"))
    b = str(save(make_results({"c": timings(0.1, seed=2)}, gpu=None, sha="b" * 40), tmp_path / "b"))
    assert run_cli(a, b, "--out", str(out_dir)) == 2
    assert "(timings are compared only between GPU runs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--gate-impls", ""), "--gate-impls must list implementation names"),
        (("--impls", ","), "--impls must list implementation names"),
        (("--history", ""), "--history is empty; expected the reports folder"),
    ],
)
def test_empty_option_values_are_named(argv: tuple[str, ...], message: str, out_dir: Path, capsys) -> None:
    # argparse refuses a bad option value with SystemExit(2); the command's own checks return 2
    try:
        code = run_cli(*argv, "--out", str(out_dir))
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def with_ceilings(results: Results, tflops: float, gbs: float) -> Results:
    results.ceilings = {"bf16_tflops": tflops, "copy_bandwidth_gbs": gbs, "method": "test"}
    return results


def test_ceilings_that_moved_get_a_note_with_both_values() -> None:
    base = with_ceilings(one_case(0.1, seed=1), 779.0, 4264.0)
    head = with_ceilings(one_case(0.1, seed=2), 740.0, 4263.0)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    (note,) = [n for n in c.notes if "ceilings" in n]
    assert "bf16 tensor peak 779 -> 740 TFLOP/s (-5.0%)" in note
    assert "copy bandwidth 4264 -> 4263 GB/s (-0.0%)" in note
    assert "% of floor" in note


def test_an_empty_kernel_that_moved_gets_a_note_and_one_that_did_not_none() -> None:
    base = with_ceilings(one_case(0.1, seed=1), 779.0, 4264.0)
    head = with_ceilings(one_case(0.1, seed=2), 779.0, 4264.0)
    base.ceilings["empty_kernel_ms"], head.ceilings["empty_kernel_ms"] = 0.0035, 0.0042
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    (note,) = [n for n in c.notes if "empty kernel" in n]
    assert "3.50 -> 4.20 us (+20%)" in note
    assert not any("ceilings" in n for n in c.notes)  # the ceilings themselves did not move
    head.ceilings["empty_kernel_ms"] = 0.0037  # +6 %: within 10 %
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert not any("empty kernel" in n for n in c.notes)
    del head.ceilings["empty_kernel_ms"]  # a run from before it was timed
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert not any("empty kernel" in n for n in c.notes)


def test_ceilings_within_two_percent_or_missing_get_no_note() -> None:
    base = with_ceilings(one_case(0.1, seed=1), 779.0, 4264.0)
    head = with_ceilings(one_case(0.1, seed=2), 770.0, 4300.0)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert not any("ceilings" in n for n in c.notes)
    bare = one_case(0.1, seed=3)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", bare))
    assert not any("ceilings" in n for n in c.notes)


def test_impls_option_restricts_the_gate(tmp_path: Path, out_dir: Path) -> None:
    # The kernel 10 % slower, the reference the same.
    a = str(save(_two_impl_results(0.5, 10.0, seed=1), tmp_path / "a"))
    b = str(save(_two_impl_results(0.55, 10.0, seed=5), tmp_path / "b"))
    assert run_cli(a, b, "--out", str(out_dir), "--impls", "sglang-triton-ps1") == 0
    assert run_cli(a, b, "--out", str(out_dir), "--impls", "verify-attn-cuda") == 1


def test_a_name_or_pattern_that_matches_no_implementation_is_refused(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --impls would compare nothing, and one in --gate-impls gate nothing: both
    would read "no regression". They are refused, naming the option and the runs' names."""
    a = str(save(_two_impl_results(0.5, 10.0, seed=1), tmp_path / "a"))
    b = str(save(_two_impl_results(0.55, 10.0, seed=5), tmp_path / "b"))
    for option in ("--impls", "--gate-impls"):
        assert run_cli(a, b, "--out", str(out_dir), option, "verify-attn-cudaa") == 2
        err = capsys.readouterr().err
        assert f"{option} verify-attn-cudaa: matches no implementation" in err
        assert "sglang-triton-ps1, verify-attn-cuda" in err
    # The same typo in the history gate CI runs.
    reports = tmp_path / "reports"
    _slower_history(reports)
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--gate-impls", "verify-attn-cudaa") == 2


def test_two_runs_with_nothing_in_common_are_refused(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs that share no case and no parity row vouch for nothing (e.g. two A/B runs, whose rows
    are named by their builds): an error, not "no regression"."""
    a = str(save(make_results({"c": timings(0.1, seed=1)}), tmp_path / "a"))
    b = str(save(make_results({"d": timings(0.1, seed=2)}, sha="b" * 40), tmp_path / "b"))
    assert run_cli(a, b, "--out", str(out_dir)) == 2
    assert "no case or parity row in common" in capsys.readouterr().err


def test_min_change_outside_zero_one_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_cli("a", "b", "--min-change", "3")
    assert "--min-change must be a fraction" in capsys.readouterr().err


def test_an_argument_that_is_neither_path_nor_revision_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    git_repo(tmp_path)
    monkeypatch.chdir(tmp_path)
    save(one_case(0.1, seed=1), tmp_path / "b")
    assert run_cli("no-such-thing", "b") == 2
    assert "BASE: 'no-such-thing' is neither" in capsys.readouterr().err


# --- HTML -----------------------------------------------------------------------------------------


class _Rows(HTMLParser):
    """Cell texts of every table row, by table (in document order)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_html_is_written_and_holds_the_verdict_table(tmp_path: Path, out_dir: Path) -> None:
    base = make_results(
        {"B1-P65536-T16-H8-shuffled": timings(0.1, seed=1), "B1-P1000-T4-H8-shuffled": timings(0.05, seed=3)},
        parity=[parity_row("smoke", "pass")],
    )
    head = make_results(
        {
            "B1-P65536-T16-H8-shuffled": timings(0.11, seed=2),
            "B1-P1000-T4-H8-shuffled": timings(0.05, seed=4),
        },
        parity=[parity_row("smoke", "pass")],
        sha="b" * 40,
    )
    assert (
        run_cli(str(save(base, tmp_path / "a")), str(save(head, tmp_path / "b")), "--out", str(out_dir)) == 1
    )
    (page,) = out_dir.glob("*.html")
    assert page.name == "compare-sweep-quick-nvidia-h200-aaaaaaa-vs-bbbbbbb.html"
    parser = _Rows()
    parser.feed(page.read_text())
    timing = next(t for t in parser.tables if t and "HEAD ms" in t[0])
    body = {row[1]: row[0] for row in timing[1:]}
    assert body == {"B1-P65536-T16-H8-shuffled": "SLOWER", "B1-P1000-T4-H8-shuffled": "SAME"}
    assert "<svg" in page.read_text() and "q1(HEAD) &gt; q3(BASE)" in page.read_text()
    assert not list(out_dir.glob(".*.tmp"))


def _strict_json(text: str) -> dict:
    """Parse JSON as strictly as other tools do: NaN and Infinity are not JSON."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_the_verdicts_are_written_as_json_beside_the_page_counting_what_the_exit_status_counts(
    tmp_path: Path, out_dir: Path
) -> None:
    base = make_results(
        {"B1-P65536-T16-H8-shuffled": timings(0.1, seed=1), "B1-P1000-T4-H8-shuffled": timings(0.05, seed=3)},
        parity=[parity_row("smoke", "pass"), parity_row("ddtree", "pass")],
    )
    head = make_results(
        {
            "B1-P65536-T16-H8-shuffled": timings(0.11, seed=2),
            "B1-P1000-T4-H8-shuffled": timings(0.05, seed=4),
        },
        parity=[parity_row("smoke", "pass"), parity_row("ddtree", "fail")],
        sha="b" * 40,
    )
    a, b = save(base, tmp_path / "a"), save(head, tmp_path / "b")
    assert run_cli(str(a), str(b), "--out", str(out_dir)) == 1
    (page,) = out_dir.glob("*.html")
    (data,) = out_dir.glob("*.json")
    assert data.name == page.name.removesuffix(".html") + ".json"
    doc = _strict_json(data.read_text())
    assert (doc["schema"], doc["schema_version"]) == ("verify-attention/compare-verdicts", 1)
    assert doc["group"] == {"gpu_model": H200, "kind": "sweep", "grid": "quick"}
    assert (doc["base"]["sha"], doc["head"]["sha"]) == ("a" * 40, "b" * 40)
    assert doc["base"]["label"] == str(a) and doc["head"]["created_utc"] == head.created_utc
    timing = {t["case_id"]: t for t in doc["timing"]}
    slower, same = timing["B1-P65536-T16-H8-shuffled"], timing["B1-P1000-T4-H8-shuffled"]
    assert (slower["verdict"], slower["counted"], same["verdict"], same["counted"]) == (
        "SLOWER",
        True,
        "SAME",
        False,
    )
    # the numbers behind the verdict, as the rule reads them
    assert slower["head"]["q1_ms"] > slower["base"]["q3_ms"] and 0.05 < slower["change"] < 0.15
    assert slower["p_value"] < 0.01 and slower["base"]["n"] == slower["head"]["n"] == 60
    parity = {(r["bundle"], r["impl"]): r for r in doc["parity"]}
    assert parity[("ddtree", "verify-attn-cuda")]["verdict"] == "REGRESSED"
    assert parity[("ddtree", "verify-attn-cuda")]["counted"] is True
    assert parity[("ddtree", "verify-attn-cuda")]["head_status"] == "fail"
    assert parity[("smoke", "verify-attn-cuda")]["counted"] is False
    counted = [r for r in (*doc["timing"], *doc["parity"]) if r["counted"]]
    assert doc["regressions"] == len(counted) == 2
    assert doc["counts"] == {"REGRESSED": 1, "SLOWER": 1, "SAME": 2}
    assert not list(out_dir.glob(".*.tmp"))


def test_the_json_marks_ungated_and_waived_slowdowns_as_shown_not_counted(
    tmp_path: Path, out_dir: Path
) -> None:
    base = save(_two_impl_results(0.5, 10.0, seed=1), tmp_path / "a")
    ref_slower = save(_two_impl_results(0.5, 11.0, seed=3), tmp_path / "b")
    assert run_cli(str(base), str(ref_slower), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda") == 0
    doc = _strict_json(next(out_dir.glob("*.json")).read_text())
    ref = next(t for t in doc["timing"] if t["impl"] == "sglang-triton-ps1")
    assert (ref["verdict"], ref["regression"], ref["gated"], ref["counted"]) == ("SLOWER", True, False, False)
    assert doc["gated_impls"] == ["verify-attn-cuda"] and doc["regressions"] == 0

    reports = tmp_path / "reports"
    _slower_history(reports)
    (reports / "waivers.toml").write_text(WAIVER.format(cases='"c cold"'))
    waived_out = tmp_path / "waived"
    assert run_cli("--history", str(reports), "--out", str(waived_out)) == 0
    doc = _strict_json(next(waived_out.glob("*.json")).read_text())
    c = next(t for t in doc["timing"] if t["case_id"] == "c")
    assert (c["verdict"], c["gated"], c["waived"], c["counted"]) == ("SLOWER", True, True, False)
    assert doc["gated_impls"] is None and doc["regressions"] == 0
    assert any("same-GPU A/B" in n for n in doc["waiver_notes"])


def test_a_case_without_usable_samples_is_written_with_nulls(tmp_path: Path, out_dir: Path) -> None:
    a = save(one_case(0.1, seed=1), tmp_path / "a")
    b = save(make_results({"c": [0.0] * 10}, sha="b" * 40), tmp_path / "b")  # no time to compare
    assert run_cli(str(a), str(b), "--out", str(out_dir)) == 1
    doc = _strict_json(next(out_dir.glob("*.json")).read_text())
    (c,) = doc["timing"]
    assert (c["verdict"], c["counted"], c["change"], c["p_value"], c["head"]) == (
        "NO DATA",
        True,
        None,
        None,
        None,
    )


# --- finding runs: git revisions and history --------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run(
        ["git", "-C", str(repo), *ident, *args], check=True, capture_output=True, text=True
    ).stdout


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    return path


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def test_a_revision_resolves_to_its_newest_committed_run_of_the_same_model_and_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git_repo(tmp_path / "repo")
    reports = repo / "reports"
    save(one_case(0.2, seed=9, created="2025-01-01T00:00:00Z"), reports / "old")
    save(one_case(0.1, seed=1, created="2025-02-01T00:00:00Z"), reports / "base")
    # newer, but another GPU model and another grid: must not be picked
    save(
        one_case(0.5, seed=5, gpu="NVIDIA B200", created="2025-03-01T00:00:00Z"),
        reports / "b200",
    )
    save(
        one_case(0.5, seed=6, grid="full", created="2025-03-01T00:00:00Z"),
        reports / "full",
    )
    base_sha = commit_all(repo, "base runs")
    head = save(
        one_case(0.11, seed=2, sha="b" * 40, created="2025-04-01T00:00:00Z"),
        tmp_path / "head",
    )
    monkeypatch.chdir(repo)

    ((base_side, head_side),) = compare.resolve_pairs(base_sha[:10], str(head))
    assert base_side.label.endswith("reports/base/results.json")
    assert head_side.label == str(head)
    assert run_cli(base_sha[:10], str(head), "--out", str(out_dir)) == 1
    assert "SLOWER 1" in capsys.readouterr().out


def test_two_revisions_compare_every_group_present_at_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = git_repo(tmp_path / "repo")
    reports = repo / "reports"
    save(one_case(0.1, seed=1, created="2025-01-01T00:00:00Z"), reports / "q1")
    save(
        make_results(parity=[parity_row("smoke", "pass")], kind="parity", created="2025-01-01T00:00:00Z"),
        reports / "p1",
    )
    first = commit_all(repo, "first")
    save(
        one_case(0.1, seed=2, sha="b" * 40, created="2025-01-02T00:00:00Z"),
        reports / "q2",
    )
    second = commit_all(repo, "second")
    monkeypatch.chdir(repo)
    pairs = compare.resolve_pairs(first, second)
    labels = sorted((b.label.split(": ")[1], h.label.split(": ")[1]) for b, h in pairs)
    assert labels == [
        ("reports/p1/results.json", "reports/p1/results.json"),
        ("reports/q1/results.json", "reports/q2/results.json"),
    ]


def test_a_revision_without_a_matching_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git_repo(tmp_path / "repo")
    save(one_case(0.1, seed=1, grid="full"), repo / "reports" / "x")
    sha = commit_all(repo, "x")
    head = save(one_case(0.1, seed=1, grid="quick"), tmp_path / "head")
    monkeypatch.chdir(repo)
    assert run_cli(sha, str(head)) == 2
    assert "has no committed run of sweep quick on NVIDIA H200" in capsys.readouterr().err


def test_history_compares_the_newest_two_of_each_model_and_grid(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    # "-05:00" sorts before "+00:00" as text but is the later time: order must use the time itself
    save(
        one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00+00:00"),
        reports / "r1",
    )
    save(
        one_case(0.1, seed=2, sha="2" * 40, created="2025-01-02T00:00:00+00:00"),
        reports / "r2",
    )
    save(
        one_case(0.11, seed=3, sha="3" * 40, created="2025-01-01T23:00:00-05:00"),
        reports / "r3",
    )
    save(one_case(0.5, seed=4, sha="4" * 40, gpu="NVIDIA B200"), reports / "b200")
    save(one_case(0.5, seed=5, sha="5" * 40, grid="full"), reports / "full")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    out = capsys.readouterr().out
    assert out.count("compare sweep") == 1
    assert "BASE 2222222" in out and "HEAD 3333333" in out and "SLOWER 1" in out


def test_history_reads_the_runs_git_tracks_or_would_track(tmp_path: Path, out_dir: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    reports = repo / "reports"
    (repo / ".gitignore").write_text("reports/_work/\n")
    save(
        one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"),
        reports / "r1",
    )
    r2 = save(
        one_case(0.1, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z"),
        reports / "r2",
    )
    commit_all(repo, "runs")
    # Ignored: a scratch run under reports/_work is never gated, however new.
    save(
        one_case(0.3, seed=3, sha="3" * 40, created="2025-01-05T00:00:00Z"),
        reports / "_work" / "scratch",
    )
    pairs = compare.history_pairs(reports)
    assert [(b.results.git["sha"][0], h.results.git["sha"][0]) for b, h in pairs] == [("1", "2")]
    # A pruned run before its commit: the tracked results.json is gone, the .gz is new.
    compress_results(r2)
    assert not r2.exists()
    pairs = compare.history_pairs(reports)
    assert [(b.results.git["sha"][0], h.results.git["sha"][0]) for b, h in pairs] == [("1", "2")]
    # A new run not yet added is what the next commit would hold: it is gated as HEAD.
    save(
        one_case(0.1, seed=4, sha="4" * 40, created="2025-01-03T00:00:00Z"),
        reports / "r4",
    )
    pairs = compare.history_pairs(reports)
    assert [(b.results.git["sha"][0], h.results.git["sha"][0]) for b, h in pairs] == [("2", "4")]


def test_history_and_revisions_read_compressed_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report --prune` leaves older runs as results.json.gz: the history gate and a revision
    argument read them as they read the plain file."""
    repo = git_repo(tmp_path / "repo")
    reports = repo / "reports"
    old = save(
        one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"),
        reports / "r1",
    )
    compress_results(old)
    first = commit_all(repo, "r1")
    save(
        one_case(0.11, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z"),
        reports / "r2",
    )
    commit_all(repo, "r2")
    ((base, head),) = compare.history_pairs(reports)
    assert base.label.endswith("r1/results.json.gz") and head.label.endswith("r2/results.json")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    assert "SLOWER 1" in capsys.readouterr().out
    monkeypatch.chdir(repo)
    ((base, head),) = compare.resolve_pairs(first, str(reports / "r2"))
    assert base.label.endswith("reports/r1/results.json.gz") and base.results.git["sha"] == "1" * 40


def test_a_run_with_both_forms_of_its_results_counts_once(tmp_path: Path) -> None:
    """A prune cut short between writing results.json.gz and removing results.json leaves both:
    the run is still one run (its plain file), not two that the gate would compare with each other."""
    reports = tmp_path / "reports"
    save(
        one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"),
        reports / "r1",
    )
    r2 = one_case(0.1, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z")
    compress_results(save(r2, reports / "r2"))
    save(r2, reports / "r2")
    ((base, head),) = compare.history_pairs(reports)
    assert base.label.endswith("r1/results.json") and head.label.endswith("r2/results.json")


# --- waivers -----------------------------------------------------------------------------------


def _slower_history(reports: Path) -> None:
    """Two runs: case "c" 10 % slower (SLOWER), case "d" unchanged."""
    for i, c_ms in ((1, 0.1), (2, 0.11)):
        save(
            make_results(
                {"c": timings(c_ms, seed=2 * i - 1), "d": timings(0.2, seed=2 * i)},
                sha=str(i) * 40,
                created=f"2025-01-0{i}T00:00:00Z",
            ),
            reports / f"r{i}",
        )


WAIVER = """
[[waiver]]
base = "1111111"
head = "2222222"
gpu_model = "NVIDIA H200"
kind = "sweep"
grid = "quick"
impl = "verify-attn-cuda"
cases = [{cases}]
reason = "the boards' power caps differ; a same-GPU A/B shows +1 %"
evidence = ["reports/x-ab-quick-nvidia-h200-1111111-vs-2222222"]
"""


def test_a_waiver_for_this_pair_accepts_the_named_slower_case(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    _slower_history(reports)
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    capsys.readouterr()
    (reports / "waivers.toml").write_text(WAIVER.format(cases='"c cold"'))
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 0
    out = capsys.readouterr().out
    assert "SLOWER (waived)" in out and "waived 1 SLOWER" in out and "same-GPU A/B" in out
    assert "evidence: reports/x-ab-quick" in out
    page = next(out_dir.glob("compare-*.html")).read_text()
    assert "waived" in page and "same-GPU A/B" in page


def test_a_waiver_never_covers_another_pair_or_an_unnamed_case(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    _slower_history(reports)
    waivers = tmp_path / "w.toml"
    # the right pair, another case: "c" stays a regression, the entry is reported as unused
    waivers.write_text(WAIVER.format(cases='"d cold"'))
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--waivers", str(waivers)) == 1
    assert "not SLOWER here: d cold" in capsys.readouterr().out
    # the named case, another pair (a later run of new code): no effect
    waivers.write_text(WAIVER.format(cases='"c cold"').replace('head = "2222222"', 'head = "3333333"'))
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--waivers", str(waivers)) == 1
    # another mode of the named case: no effect
    waivers.write_text(WAIVER.format(cases='"c graph"'))
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--waivers", str(waivers)) == 1


def test_a_waiver_matches_a_run_whether_either_side_gives_the_short_or_the_full_sha(
    tmp_path: Path, out_dir: Path
) -> None:
    reports = tmp_path / "reports"
    _slower_history(reports)  # the runs store 40 digits
    waivers = tmp_path / "w.toml"
    full = (
        WAIVER.format(cases='"c cold"')
        .replace('"1111111"', f'"{"1" * 40}"')
        .replace('"2222222"', f'"{"2" * 40}"')
    )
    waivers.write_text(full)
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--waivers", str(waivers)) == 0
    # Runs that store 7 digits (as many committed runs do), a waiver with 40.
    short = tmp_path / "short"
    for run in ("r1", "r2"):
        doc = json.loads((reports / run / "results.json").read_text())
        doc["git"]["sha"] = doc["git"]["sha"][:7]
        (short / run).mkdir(parents=True)
        (short / run / "results.json").write_text(json.dumps(doc))
    assert run_cli("--history", str(short), "--out", str(out_dir), "--waivers", str(waivers)) == 0
    # Another commit sharing the first 7 digits is not waived by a 40-digit sha it does not match.
    waivers.write_text(full.replace(f'"{"2" * 40}"', f'"{"2" * 7 + "3" * 33}"'))
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--waivers", str(waivers)) == 1


def test_a_waivers_file_that_is_not_utf8_text_is_refused_naming_it(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    _slower_history(reports)
    waivers = tmp_path / "w.toml"
    waivers.write_bytes(bytes(range(256)))
    assert run_cli("--history", str(reports), "--out", str(out_dir), "--waivers", str(waivers)) == 2
    assert f"waivers {waivers}: cannot read it as TOML" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_an_out_that_cannot_be_written_exits_2_before_comparing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    a = str(save(one_case(0.1, seed=1), tmp_path / "a"))
    b = str(save(one_case(0.1, seed=2, sha="b" * 40), tmp_path / "b"))
    (tmp_path / "file").write_text("not a folder")
    assert run_cli(a, b, "--out", str(tmp_path / where)) == 2
    captured = capsys.readouterr()
    assert f"compare: --out {tmp_path / where}" in captured.err and captured.out == ""


def test_history_over_a_git_ignored_folder_says_its_runs_were_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("reports/_work/\n")
    for i in (1, 2):
        save(
            one_case(0.1 * i, seed=i, sha=str(i) * 40, created=f"2025-01-0{i}T00:00:00Z"),
            repo / "reports" / "_work" / f"r{i}",
        )
    assert run_cli("--history", str(repo / "reports" / "_work"), "--out", str(tmp_path / "html")) == 0
    out = capsys.readouterr().out
    assert "nothing to compare (2 results file(s) there are ignored by git and left out" in out


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace('base = "1111111"', 'base = "main"'), "'base' must be 7-40 lowercase hex"),
        (lambda t: t.replace('cases = ["c cold"]', "cases = []"), "'cases' must be a non-empty list"),
        (lambda t: t.replace('"c cold"', '"c"'), "must read 'CASE_ID MODE'"),
        (lambda t: t.replace('reason = "the', 'reason = "" # "the'), "'reason' must be a non-empty string"),
        (lambda t: t.replace("evidence = [", "evidence = [] # ["), "'evidence' must be a non-empty list"),
        (lambda t: t + 'colour = "red"\n', "unknown keys ['colour']"),
        (lambda t: t + "[other]\n", "unknown top-level keys ['other']"),
        (lambda t: t.replace("[[waiver]]", "[[waiver"), "cannot read it as TOML"),
    ],
)
def test_a_malformed_waiver_file_is_refused_naming_the_field(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str], edit, message: str
) -> None:
    reports = tmp_path / "reports"
    _slower_history(reports)
    (reports / "waivers.toml").write_text(edit(WAIVER.format(cases='"c cold"')))
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 2
    err = capsys.readouterr().err
    assert message in err and "waivers.toml" in err


def test_every_committed_waiver_names_a_pair_of_committed_runs_and_their_cases() -> None:
    """A waiver whose runs or cases are not in the history is dead text (a typo in a sha or a
    case id): it waives nothing and says it does."""
    reports = Path(__file__).resolve().parent.parent / "reports"
    waivers = compare.load_waivers(reports / compare.WAIVERS_FILE)
    assert waivers
    runs = [compare.Side(str(p), compare.load_results(p)) for p in compare.tracked_results(reports)]

    def runs_of(w: compare.Waiver, prefix: str) -> list[compare.Side]:
        key = compare.RunKey(w.gpu_model, w.kind, w.grid)
        return [r for r in runs if r.key == key and str(r.results.git.get("sha", "")).startswith(prefix)]

    for w in waivers:
        assert runs_of(w, w.base), f"waiver {w.base} -> {w.head}: no committed {w.grid} run of {w.base}"
        heads = runs_of(w, w.head)
        assert heads, f"waiver {w.base} -> {w.head}: no committed {w.grid} run of {w.head}"
        timed = {(r.case_id, r.mode) for h in heads for r in h.results.sweep if r.impl == w.impl}
        missing = [c for c in w.cases if c not in timed]
        assert not missing, f"waiver {w.base} -> {w.head} names cases its HEAD run did not time: {missing}"


def test_history_with_nothing_to_compare_exits_0_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(one_case(0.1, seed=1), tmp_path / "reports" / "only")
    assert run_cli("--history", str(tmp_path / "reports")) == 0
    assert "nothing to compare" in capsys.readouterr().out


def test_run_grid_reads_the_command_line() -> None:
    r = make_results({})
    assert compare.run_grid(r) == "quick"
    for command, grid in [
        ("python -m harness sweep --grid=harness/grids/mine.toml", "mine"),
        ("python -m harness sweep", "default"),
        ("python -m harness sweep --grid quick --tp 8", "quick-tp8"),
    ]:
        r.command = command
        assert compare.run_grid(r) == grid
    r = make_results(kind="parity")
    r.command = "python -m harness parity --bundles smoke,ddtree --mutations"
    assert compare.run_grid(r) == "ddtree,smoke"


def test_a_narrowed_run_is_its_own_group() -> None:
    r = make_results({})
    for command, grid in [
        ("python -m harness sweep --grid quick --modes cold", "quick [--modes cold]"),
        ("python -m harness sweep --grid quick --impls verify-attn-cuda", "quick [--impls verify-attn-cuda]"),
        (
            "python -m harness sweep --case-filter P4096 --shard 0/2",
            "default [--case-filter P4096, --shard 0/2]",
        ),
        ("python -m harness sweep --grid quick --case-filter ''", "quick"),
    ]:
        r.command = command
        assert compare.run_grid(r) == grid
    r = make_results(kind="parity")
    r.command = "python -m harness parity"
    assert compare.run_grid(r) == "all-bundles [no --mutations]"
    r.command = "python -m harness parity --mutations --impls oracle"
    assert compare.run_grid(r) == "all-bundles [--impls oracle]"


def test_history_does_not_take_a_narrowed_run_for_the_newest_full_one(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    save(
        one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"),
        reports / "r1",
    )
    save(
        one_case(0.12, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z"),
        reports / "r2",
    )
    partial = make_results({}, sha="3" * 40, created="2025-01-03T00:00:00Z")
    partial.command += " --impls sglang-triton-ps1"
    save(partial, reports / "r3")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    out = capsys.readouterr().out
    assert "BASE 1111111" in out and "HEAD 2222222" in out and "SLOWER 1" in out


def test_corrupt_results_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad" / "results.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"schema": "verify-attention/results"})[:-3])
    good = save(one_case(0.1, seed=1), tmp_path / "good")
    assert run_cli(str(bad.parent), str(good)) == 2
    assert str(bad) in capsys.readouterr().err


# --- gated implementations --------------------------------------------------------------------


def _two_impl_results(kernel_ms: float, ref_ms: float, *, seed: int, parity_status: str = "pass") -> Results:
    r = make_results(
        parity=[parity_row("smoke", "pass"), parity_row("smoke", parity_status, impl="sglang-triton-ps1")]
    )
    return Results(
        **{
            **r.__dict__,
            "sweep": [
                sweep_row("c1", timings(kernel_ms, seed=seed)),
                sweep_row("c1", timings(ref_ms, seed=seed + 1), impl="sglang-triton-ps1"),
            ],
        }
    )


def test_gate_impls_counts_only_the_gated_implementations_timing(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reference implementation 10 % slower (another board) fails the plain gate, not the
    kernel-only gate, which still lists it; the kernel 10 % slower fails both."""
    base = save(_two_impl_results(0.5, 10.0, seed=1), tmp_path / "a")
    ref_slower = save(_two_impl_results(0.5, 11.0, seed=3), tmp_path / "b")
    assert run_cli(str(base), str(ref_slower), "--out", str(out_dir)) == 1
    capsys.readouterr()
    assert run_cli(str(base), str(ref_slower), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda") == 0
    out = capsys.readouterr().out
    assert "not gated (only verify-attn-cuda is): 1 SLOWER/NO DATA in sglang-triton-ps1" in out
    assert "no regression" in out
    kernel_slower = save(_two_impl_results(0.55, 10.0, seed=5), tmp_path / "c")
    assert (
        run_cli(str(base), str(kernel_slower), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda") == 1
    )


def test_gate_impls_takes_shell_patterns(tmp_path: Path, out_dir: Path) -> None:
    """CI gates 'verify-attn-cuda*': every entry of the kernel (forced configs too), no reference."""
    base = save(_two_impl_results(0.5, 10.0, seed=1), tmp_path / "a")
    ref_slower = save(_two_impl_results(0.5, 11.0, seed=3), tmp_path / "b")
    kernel_slower = save(_two_impl_results(0.55, 10.0, seed=5), tmp_path / "c")
    assert (
        run_cli(str(base), str(ref_slower), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda*") == 0
    )
    assert (
        run_cli(str(base), str(kernel_slower), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda*")
        == 1
    )
    # A pattern that matches no implementation of the runs would gate nothing: refused, naming it.
    assert (
        run_cli(str(base), str(kernel_slower), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda-*")
        == 2
    )


def test_gate_impls_never_ungates_a_parity_regression(tmp_path: Path, out_dir: Path) -> None:
    base = save(_two_impl_results(0.5, 10.0, seed=1), tmp_path / "a")
    head = save(_two_impl_results(0.5, 10.0, seed=1, parity_status="fail"), tmp_path / "b")
    assert run_cli(str(base), str(head), "--out", str(out_dir), "--gate-impls", "verify-attn-cuda") == 1


@pytest.mark.parametrize("suffix", ["html", "json"])
def test_a_compare_file_that_cannot_be_written_exits_2_not_1(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    """1 says "regressions" to CI: a page or verdicts file that cannot be written (here its name
    is a folder) is not one, and no traceback."""
    a = str(save(one_case(0.1, seed=1), tmp_path / "a"))
    b = str(save(one_case(0.1, seed=2, sha="b" * 40), tmp_path / "b"))
    assert run_cli(a, b, "--out", str(out_dir)) == 0
    (written,) = out_dir.glob(f"compare-*.{suffix}")
    written.unlink()
    written.mkdir()
    assert run_cli(a, b, "--out", str(out_dir)) == 2
    assert f"compare: --out {out_dir}: cannot write {written.name} there (" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ("empty", "--history {}: no results.json (or results.json.gz) found there"),
        ("missing", "--history: {} is not a folder"),
    ],
)
def test_history_over_a_folder_without_any_run_exits_2(
    folder: str, message: str, tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo'd or wrong --history folder must not pass the gate as "nothing to compare"."""
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert run_cli("--history", str(tmp_path / folder), "--out", str(out_dir)) == 2
    assert message.format(tmp_path / folder) in capsys.readouterr().err


def test_an_empty_out_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = str(save(one_case(0.1, seed=1), tmp_path / "a"))
    b = str(save(one_case(0.1, seed=2, sha="b" * 40), tmp_path / "b"))
    with pytest.raises(SystemExit) as exit_:
        run_cli(a, b, "--out", "")
    assert exit_.value.code == 2
    assert (
        "argument --out: expected a folder for the HTML diff and its verdicts file, got ''"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("side", ["base", "head", "neither"])
def test_a_decided_row_that_was_throttled_is_marked_and_noted(side: str) -> None:
    slow = [1.2, 1.21, 1.22, 1.23, 1.24] * 4
    fast = [1.0, 1.01, 1.02, 1.03, 1.04] * 4
    base = make_results({"B1-P1024-T16-H8": fast})
    head = make_results({"B1-P1024-T16-H8": slow})
    for run, name in ((base, "base"), (head, "head")):
        run.sweep[0] = replace(run.sweep[0], throttled=side == name)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    (v,) = c.timing
    assert v.verdict == compare.SLOWER and v.throttled == (side != "neither")
    noted = any("throttled on one side" in n for n in c.notes)
    assert noted == (side != "neither")
    assert ("SLOWER (throttled)" in compare.format_terminal(c)) == (side != "neither")


def test_a_verdict_says_how_many_samples_each_side_read_capped_where_they_were_read_so() -> None:
    slow = [1.2, 1.21, 1.22, 1.23, 1.24] * 4
    fast = [1.0, 1.01, 1.02, 1.03, 1.04] * 4
    base = make_results({"B1-P1024-T16-H8": fast})
    head = make_results({"B1-P1024-T16-H8": slow})
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert c.timing[0].capped == ""  # runs from before samples were read one by one
    head.sweep[0] = replace(head.sweep[0], throttled=True, throttled_samples=[0, 3, 7])
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    (v,) = c.timing
    assert v.capped == "capped samples: BASE -, HEAD 3/20"
    assert "SLOWER (throttled)" in compare.format_terminal(c)
    assert "; capped samples: BASE -, HEAD 3/20" in compare.format_terminal(c)
    base.sweep[0] = replace(base.sweep[0], throttled_samples=[])
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert c.timing[0].capped == "capped samples: BASE 0/20, HEAD 3/20"
    assert "capped samples: BASE 0/20, HEAD 3/20" in compare.render_html(c)
    # one side flagged with the clock rule, the other by a cap alone: the text says which
    head.sweep[0] = replace(head.sweep[0], throttle_clock_line_mhz=1940.4)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert c.timing[0].capped == (
        "capped samples: BASE 0/20, HEAD 3/20 (BASE's flagged by a cap alone, without the clock rule)"
    )
    base.sweep[0] = replace(base.sweep[0], throttle_clock_line_mhz=1940.4)
    c = compare.compare_results(compare.Side("a", base), compare.Side("b", head))
    assert c.timing[0].capped == "capped samples: BASE 0/20, HEAD 3/20"


# --- the gate's blind spots (history groups, gated implementations, builds, revisions, git) ------


def test_history_judges_a_groups_only_run_by_its_own_failing_parity_rows(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A narrowed run, or the first run of a new GPU model or grid, is its group's only run: its
    failing parity rows must count (DESIGN: parity regressions always count), not go unread."""
    reports = tmp_path / "reports"
    for i in (1, 2):
        save(
            make_results(
                parity=[parity_row("smoke", "pass")],
                kind="parity",
                sha=str(i) * 40,
                created=f"2025-01-0{i}T00:00:00Z",
            ),
            reports / f"p{i}",
        )
    lone = make_results(
        parity=[parity_row("smoke", "fail", reason="rel err 0.5")], kind="parity", sha="3" * 40
    )
    lone.command = "python -m harness parity --impls verify-attn-cuda --mutations"
    save(lone, reports / "narrowed")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    out = capsys.readouterr().out
    assert "one run (" in out and "judged alone, its failing parity rows count" in out
    assert "REGRESSED" in out
    # The same run passing: one line, no page, exit 0.
    lone.parity = [parity_row("smoke", "pass")]
    save(lone, reports / "narrowed")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 0
    assert "no parity row of it fails" in capsys.readouterr().out


def test_history_base_is_the_newest_run_of_another_commit(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second run of HEAD's commit must not stand in for the commit before it: the 30 %
    regression from 1 to 2 stays SLOWER after a re-run of 2 is committed."""
    reports = tmp_path / "reports"
    save(one_case(0.100, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"), reports / "r1")
    save(one_case(0.130, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z"), reports / "r2")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    capsys.readouterr()
    save(one_case(0.130, seed=3, sha="2" * 40, created="2025-01-03T00:00:00Z"), reports / "r3")
    ((base, head),) = compare.history_pairs(reports)
    assert base.label.endswith("r1/results.json") and head.label.endswith("r3/results.json")
    assert run_cli("--history", str(reports), "--out", str(out_dir)) == 1
    assert "SLOWER 1" in capsys.readouterr().out
    # A group whose runs are all of one commit compares its newest two.
    same = tmp_path / "same"
    save(one_case(0.100, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"), same / "a")
    save(one_case(0.100, seed=2, sha="1" * 40, created="2025-01-02T00:00:00Z"), same / "b")
    ((base, head),) = compare.history_pairs(same)
    assert base.label.endswith("a/results.json") and head.label.endswith("b/results.json")


def test_a_gated_implementation_gone_from_head_counts_as_no_data(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--gate-impls 'verify-attn-cuda*'` over a HEAD that timed only the reference would gate
    nothing and read "no regression"."""
    base = _two_impl_results(0.5, 10.0, seed=1)
    head = _two_impl_results(0.5, 10.0, seed=5)
    head.sweep = [r for r in head.sweep if r.impl != "verify-attn-cuda"]
    a, b = str(save(base, tmp_path / "a")), str(save(head, tmp_path / "b"))
    assert run_cli(a, b, "--out", str(out_dir), "--gate-impls", "verify-attn-cuda*") == 1
    out = capsys.readouterr().out
    assert "HEAD has no timed rows of verify-attn-cuda" in out and "NO DATA" in out
    # The reference gone instead: listed as NO DATA, not gated.
    head = _two_impl_results(0.5, 10.0, seed=5)
    head.sweep = [r for r in head.sweep if r.impl == "verify-attn-cuda"]
    b = str(save(head, tmp_path / "c"))
    assert run_cli(a, b, "--out", str(out_dir), "--gate-impls", "verify-attn-cuda*") == 0


def _built_with(results: Results, tuning: list[str]) -> Results:
    return replace(results, environment={**results.environment, "build_flags": {"tuning": tuning}})


def test_runs_of_differently_built_kernels_are_not_compared_as_like(
    tmp_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z")
    trial = _built_with(one_case(0.2, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z"), ["-DVA_TRIAL=1"])
    a, b = str(save(base, tmp_path / "a")), str(save(trial, tmp_path / "b"))
    assert run_cli(a, b, "--out", str(out_dir)) == 2
    assert (
        "HEAD's with -DVA_TRIAL=1: timings of different builds are not like with like"
        in capsys.readouterr().err
    )
    assert run_cli(a, b, "--out", str(out_dir), "--force") == 1
    # In the history a tuned build's run forms a group of its own, like a narrowed run.
    reports = tmp_path / "reports"
    save(base, reports / "a")
    save(trial, reports / "b")
    assert compare.run_grid(trial) == "quick [built with -DVA_TRIAL=1]"
    assert compare.history_pairs(reports) == []


def test_a_revision_that_resolves_to_the_other_sides_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git_repo(tmp_path / "repo")
    save(one_case(0.1, seed=1, sha="1" * 40, created="2025-01-01T00:00:00Z"), repo / "reports" / "r1")
    save(one_case(0.1, seed=2, sha="2" * 40, created="2025-01-02T00:00:00Z"), repo / "reports" / "r2")
    commit_all(repo, "runs")
    monkeypatch.chdir(repo)
    assert run_cli("main", "reports/r2", "--out", str(out_dir)) == 2
    assert "is reports/r2 itself; nothing to compare" in capsys.readouterr().err


def test_history_without_git_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _slower_history(tmp_path / "reports")
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-bin"))
    assert run_cli("--history", str(tmp_path / "reports"), "--out", str(out_dir)) == 2
    assert "git is not installed" in capsys.readouterr().err
