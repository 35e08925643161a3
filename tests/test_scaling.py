"""The fixed cost and steady rate of a series of prefix lengths (harness/scaling.py), on rows made
from known lines, and their table in the report and on the command line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.report import render_html
from harness.results import load_results
from harness.scaling import MIN_PREFIXES, fit_rows, fits, half_floor_text, line, records, text_table

DATA = Path(__file__).parent / "data"
SWEEP = DATA / "sweep-h200" / "results.json"
PARITY = DATA / "parity-cpu" / "results.json"
PREFIXES = (1024, 4096, 32768, 65536, 262144)

BASE = next(r for r in load_results(SWEEP).sweep if r.impl == "verify-attn-cuda" and r.status == "ok")


def row(prefix: int, median_ms: float, floor_ms: float | None = None, **params):
    """A timed row of the series BASE names, at ``prefix``, with ``params`` changed."""
    params = {**BASE.params, "prefix_len": prefix, **params}
    return replace(
        BASE,
        case_id="-".join(f"{k}{v}" for k, v in sorted(params.items())),
        params=params,
        median_ms=median_ms,
        samples_ms=[median_ms] * 3,
        floor_ms=floor_ms,
        tp_rank=None,
        status="ok",
    )


def series(fixed_ms: float, rate: float, floor_rate: float, prefixes=PREFIXES, **params):
    return [row(p, fixed_ms + rate * p, floor_rate * p, **params) for p in prefixes]


def test_a_series_on_a_line_gives_back_its_fixed_cost_rate_and_steady_percentage() -> None:
    f = fit_rows(series(0.0156, 0.48e-6, 0.356e-6))
    assert f is not None
    assert f.fixed_ms == pytest.approx(0.0156, rel=1e-9)
    assert f.ms_per_key == pytest.approx(0.48e-6, rel=1e-9)
    assert f.steady_pct == pytest.approx(100 * 0.356 / 0.48, rel=1e-9)
    assert f.worst_residual_pct == pytest.approx(0.0, abs=1e-9)
    assert f.prefixes == PREFIXES and f.points == len(PREFIXES)
    # 0.0156 + 0.48e-6 P = 2 * 0.356e-6 P
    assert f.half_floor_prefix == pytest.approx(0.0156 / (2 * 0.356e-6 - 0.48e-6), rel=1e-9)


def test_the_half_floor_prefix_is_every_prefix_never_or_beyond_the_grid() -> None:
    every = fit_rows(series(0.0, 0.5e-6, 0.4e-6))  # 80 % at every prefix
    assert every.half_floor_prefix == 0.0 and half_floor_text(every) == "every P"
    never = fit_rows(series(0.001, 1.0e-6, 0.4e-6))  # a steady rate of 40 %
    assert never.half_floor_prefix is None and half_floor_text(never) == "never"
    far = fit_rows(series(1.0, 0.5e-6, 0.4e-6))  # 1 s of fixed cost: 50 % only from P = 3.3M
    assert far.half_floor_prefix == pytest.approx(1.0 / 0.3e-6)
    assert half_floor_text(far) == "P >= 3,333,300 (beyond the grid)"
    inside = fit_rows(series(0.0156, 0.48e-6, 0.356e-6))
    assert half_floor_text(inside) == "P >= 67,200"


def test_relative_weights_keep_one_long_call_s_noise_from_setting_the_fixed_cost() -> None:
    rows = series(0.0156, 0.48e-6, 0.356e-6)
    rows[-1] = replace(rows[-1], median_ms=rows[-1].median_ms * 1.03)  # 3 % slower at 256k
    f = fit_rows(rows)
    assert abs(f.fixed_ms - 0.0156) < 0.01 * 0.0156  # 0.5 %
    # unweighted, that 3 % (4.2 us) moves the fixed cost five times as far
    xs = [r.params["prefix_len"] for r in rows]
    unweighted_fixed, _ = line(xs, [r.median_ms for r in rows])
    assert abs(unweighted_fixed - 0.0156) > 0.02 * 0.0156


def test_a_series_needs_three_prefix_lengths() -> None:
    assert MIN_PREFIXES == 3
    assert fit_rows(series(0.01, 1e-6, 0.5e-6, prefixes=(4096, 65536))) is None
    # the same prefix twice is one prefix length, not two
    twice = series(0.01, 1e-6, 0.5e-6, prefixes=(4096, 4096, 65536))
    assert fit_rows(twice) is None


def test_series_are_told_apart_by_implementation_mode_and_every_param_but_the_prefix() -> None:
    rows = (
        series(0.01, 1e-6, 0.5e-6, num_heads=8)
        + series(0.02, 2e-6, 1.0e-6, num_heads=16)
        + [replace(r, mode="graph") for r in series(0.005, 1e-6, 0.5e-6, num_heads=8)]
        + [replace(r, impl="other") for r in series(0.03, 4e-6, 0.5e-6, num_heads=8)]
        + series(0.04, 1e-6, 0.5e-6, num_heads=8, layout="contiguous")
    )
    got = {(f.impl, f.mode, dict(f.params)["num_heads"], dict(f.params)["layout"]): f for f in fits(rows)}
    assert len(got) == 5
    assert got[("verify-attn-cuda", "cold", 8, BASE.params["layout"])].fixed_ms == pytest.approx(0.01)
    assert got[("verify-attn-cuda", "cold", 16, BASE.params["layout"])].fixed_ms == pytest.approx(0.02)
    assert got[("verify-attn-cuda", "graph", 8, BASE.params["layout"])].fixed_ms == pytest.approx(0.005)
    assert got[("other", "cold", 8, BASE.params["layout"])].ms_per_key == pytest.approx(4e-6)
    assert got[("verify-attn-cuda", "cold", 8, "contiguous")].fixed_ms == pytest.approx(0.04)
    with pytest.raises(ValueError, match="2 series"):
        fit_rows(series(0.01, 1e-6, 0.5e-6, num_heads=8) + series(0.01, 1e-6, 0.5e-6, num_heads=16))


def test_error_rows_and_tensor_parallel_rank_rows_are_not_fitted() -> None:
    rows = series(0.01, 1e-6, 0.5e-6)
    broken = replace(rows[1], status="error", samples_ms=[], median_ms=0.0)
    rank = replace(rows[2], tp_rank=0, median_ms=99.0)
    assert fits([rows[0], broken, rank, rows[3]]) == []  # two prefix lengths remain
    f = fit_rows([*rows, rank])
    assert f.points == len(rows) and f.fixed_ms == pytest.approx(0.01)


def test_rows_without_a_floor_have_no_steady_rate_and_the_configs_are_named() -> None:
    rows = [
        replace(r, floor_ms=None, impl_config=c)
        for r, c in zip(series(0.01, 1e-6, 0.5e-6), "aabbb", strict=True)
    ]
    f = fit_rows(rows)
    assert f.steady_pct is None and f.half_floor_prefix is None and half_floor_text(f) == "-"
    assert f.configs == ("a", "b")
    rec = records([f])[0]
    assert rec["config"] == "a / b" and rec["steady % of floor"] == "-"
    assert (
        rec["prefixes"] == "1k-256k (5)" and rec["fixed us"] == "10.0 ± 0.0" and rec["us per 1k keys"] == "1"
    )


def test_the_sweep_page_shows_the_fits_and_the_parity_page_does_not() -> None:
    page = render_html(load_results(SWEEP), str(SWEEP))
    start = page.index('id="scaling"')
    section = page[start : page.index('<details id="rows">', start)]
    found = fits(load_results(SWEEP))
    assert found and section.count("<tr") == len(found) + 1  # a header and one row a fit
    for f in found:
        assert f.label() in section
    assert 'href="#scaling"' in page
    parity = render_html(load_results(PARITY), str(PARITY))
    assert 'id="scaling"' not in parity and 'href="#scaling"' not in parity


def test_report_scaling_prints_the_fits_of_each_run(capsys) -> None:
    assert cli_main(["report", "--scaling", str(SWEEP.parent)]) == 0
    out = capsys.readouterr().out
    assert str(SWEEP) in out
    assert text_table(fits(load_results(SWEEP))) in out
    assert "steady % of floor" in out


def test_report_scaling_of_a_run_without_series_says_so(capsys) -> None:
    assert cli_main(["report", "--scaling", str(PARITY)]) == 0
    assert "no series with 3 or more prefix lengths" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "--scaling"], "--scaling needs a results.json or run folder"),
        (["report", "--scaling", "--prune", "reports"], "--prune and --scaling are separate commands"),
    ],
)
def test_report_scaling_usage_errors_name_the_option(argv: list[str], message: str, capsys) -> None:
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


def test_report_scaling_of_a_folder_without_results_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    assert cli_main(["report", "--scaling", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "no results.json" in err


def test_the_fixed_cost_s_error_is_zero_on_a_line_and_large_when_extrapolated_from_afar() -> None:
    assert fit_rows(series(0.0156, 0.48e-6, 0.356e-6)).fixed_se_ms == pytest.approx(0.0, abs=1e-12)
    # 1 % noise on calls of 0.5-3 ms leaves the intercept of a few us unknown to ~+-10 us
    noisy = series(0.004, 15e-6, 11e-6, prefixes=(32768, 65536, 131072, 200000))
    noisy = [
        replace(r, median_ms=r.median_ms * (1 + e))
        for r, e in zip(noisy, (0.01, -0.01, 0.01, -0.01), strict=True)
    ]
    f = fit_rows(noisy)
    assert f.fixed_se_ms > 0.005
    near = series(0.0156, 0.48e-6, 0.356e-6)
    near = [
        replace(r, median_ms=r.median_ms * (1 + e))
        for r, e in zip(near, (0.01, -0.01, 0.01, -0.01, 0.01), strict=True)
    ]
    assert fit_rows(near).fixed_se_ms < 0.0005


def test_a_fixed_cost_within_two_errors_of_zero_is_unresolved_and_gives_no_half_floor_prefix() -> None:
    # Four heavy prefixes with +-1 % noise: the intercept (4 us) is lost in a +-10 us error, and a
    # prefix "from which 50 % is reached" computed from it would be noise; the table says so.
    noisy = series(0.004, 15e-6, 11e-6, prefixes=(32768, 65536, 131072, 200000))
    noisy = [
        replace(r, median_ms=r.median_ms * (1 + e))
        for r, e in zip(noisy, (0.01, -0.01, 0.01, -0.01), strict=True)
    ]
    f = fit_rows(noisy)
    assert not f.fixed_resolved
    assert half_floor_text(f) == "- (fixed cost unresolved)"
    assert records([f])[0]["50 % of floor from"] == "- (fixed cost unresolved)"
    # The same line measured from short prefixes up resolves it, and the prefix is given again.
    clean = fit_rows(series(0.004, 15e-6, 11e-6))
    assert clean.fixed_resolved and half_floor_text(clean) == "P >= 600"
    # A fixed cost of exactly zero on an exact line is resolved (zero error), not unresolved.
    assert fit_rows(series(0.0, 0.5e-6, 0.4e-6)).fixed_resolved


def _side(rows, sha: str):
    from harness.compare import Side
    from harness.results import Results

    results = Results(
        kind="sweep",
        created_utc="2026-01-01T00:00:00+00:00",
        command="python -m harness sweep --grid default",
        git={"sha": sha * 40, "dirty": False},
        environment={"gpu": {"name": "NVIDIA H200"}},
        sweep=rows,
    )
    return Side(sha, results)


def test_compare_shows_each_series_fixed_cost_change_beside_the_verdicts_and_does_not_gate_it(
    tmp_path: Path,
) -> None:
    from harness.compare import compare_results, format_terminal, render_html

    base = _side(series(0.0156, 0.48e-6, 0.356e-6) + series(0.02, 1e-6, 0.7e-6, num_heads=64), "a")
    head = _side(series(0.0186, 0.48e-6, 0.356e-6) + series(0.02, 1e-6, 0.7e-6, num_heads=16), "b")
    c = compare_results(base, head)
    assert len(c.scaling) == 1  # H=8 fitted on both sides; H=64 and H=16 on one side each
    (change,) = c.scaling
    assert 1000 * (change.head.fixed_ms - change.base.fixed_ms) == pytest.approx(3.0)
    text = format_terminal(c)
    assert "fixed cost and steady rate" in text and "15.6 -> 18.6" in text and "+3.0 ± 0.0" in text
    assert "74.2 -> 74.2" in text
    page = render_html(c)
    assert "Fixed cost and steady rate" in page and "15.6 -&gt; 18.6" in page
    # three samples a row decide no verdict (NOISY): the +3 us of fixed cost alone gates nothing
    assert {v.verdict for v in c.timing if v.decision.base and v.decision.head} == {"NOISY"}
    assert c.regressions == [] and "no regression" in text


def test_compare_of_runs_without_common_series_shows_no_fit_table() -> None:
    from harness.compare import compare_results, format_terminal, render_html

    base = _side(series(0.01, 1e-6, 0.5e-6, prefixes=(4096, 65536)), "a")
    head = _side(series(0.01, 1e-6, 0.5e-6, prefixes=(4096, 65536)), "b")
    c = compare_results(base, head)
    assert c.scaling == ()
    assert "fixed cost and steady rate" not in format_terminal(c)
    assert "Fixed cost and steady rate" not in render_html(c)


def test_a_list_valued_param_keys_its_series_by_value() -> None:
    rows = series(0.01, 1e-6, 0.5e-6, extra=[1, 2]) + series(0.02, 1e-6, 0.5e-6, extra=[3])
    got = sorted(1000 * f.fixed_ms for f in fits(rows))
    assert got == pytest.approx([10.0, 20.0])


def test_a_sweep_prints_its_fits_after_the_report_s_path(tmp_path: Path, capsys) -> None:
    from harness import sweep

    run = load_results(SWEEP)
    assert sweep.write_sweep_report(run, str(tmp_path / "run"), "quick") == 1  # its error row
    out = capsys.readouterr().out
    assert "fixed cost and steady rate per series of prefix lengths" in out
    assert text_table(fits(run)) in out


def test_a_sweep_without_series_prints_no_fit_table(tmp_path: Path, capsys) -> None:
    from harness import sweep

    run = load_results(SWEEP)
    run = replace(run, sweep=[r for r in run.sweep if r.params["prefix_len"] != 262144])
    sweep.write_sweep_report(run, str(tmp_path / "run"), "quick")
    assert "fixed cost" not in capsys.readouterr().out
