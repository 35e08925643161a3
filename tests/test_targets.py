"""The target cases' table (harness/targets.py): which rows it reads, what it counts as reaching the
target, and where it shows (``report --targets``, the report page)."""

from __future__ import annotations

import itertools
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.report import render_html, targets_section
from harness.results import Results, ResultsError, load_results, write_results
from harness.targets import (
    BASELINE,
    IMPL,
    SPEEDUP_CASE,
    TARGET_PCT,
    cells,
    markdown,
    speedup_line,
    target_cases,
    target_rows,
)

DATA = Path(__file__).parent / "data"
SWEEP = DATA / "sweep-h200" / "results.json"
PARITY = DATA / "parity-cpu" / "results.json"
RUN = load_results(SWEEP)
BASE = next(r for r in RUN.sweep if r.impl == IMPL and r.status == "ok")
# The issue's performance targets: B=1, P in {32k, 64k, 128k, 200k}, H in {8, 16, 64}, T in {16, 64}.
ISSUE_CASES = [
    {"prefix_len": p, "num_heads": h, "tree_size": t}
    for p, h, t in itertools.product((32768, 65536, 131072, 200000), (8, 16, 64), (16, 64))
]


def row(case: dict, pct: float, impl: str = IMPL, mode: str = "cold", **changes):
    """A timed row of ``case`` whose median puts it at ``pct`` % of its floor (floor 0.1 ms, set by
    its FLOPs at the run's peak: at another peak the floor moves with it)."""
    params = {**BASE.params, **case}
    median = 0.1 * 100.0 / pct
    fields = {
        "flops": int(0.1e-3 * RUN.ceilings["bf16_tflops"] * 1e12),
        "impl": impl,
        "mode": mode,
        "params": params,
        "case_id": f"B{params['batch_size']}-P{params['prefix_len']}-T{params['tree_size']}-H{params['num_heads']}",
        "median_ms": median,
        "samples_ms": [median] * 3,
        "floor_ms": 0.1,
        "pct_of_floor": pct,
        "tp_rank": None,
        "status": "ok",
        "throttled": False,
    }
    return replace(BASE, **{**fields, **changes})


def run_of(rows) -> Results:
    return replace(RUN, sweep=list(rows))


def full_run(pcts=None) -> Results:
    pcts = pcts or {}
    rows = []
    for case in ISSUE_CASES:
        pct = pcts.get((case["prefix_len"], case["num_heads"], case["tree_size"]), 60.0)
        rows += [row(case, pct), row(case, pct, mode="graph")]
    return run_of(rows)


def test_the_target_cases_are_the_issues_twenty_four() -> None:
    cases = target_cases()
    assert len(cases) == 24
    assert [{k: c[k] for k in ("prefix_len", "num_heads", "tree_size")} for c in cases] == ISSUE_CASES
    assert {(c["batch_size"], c["tree"], c["layout"]) for c in cases} == {(1, "eagle", "shuffled")}


def test_the_grid_axes_are_read_as_the_sweep_reads_them() -> None:
    from harness import sweep, targets

    assert targets.AXES == sweep.AXES and targets.DEFAULT_AXES == sweep.DEFAULT_AXES
    grid_cases = next(g for g in sweep.load_grid("default").groups if g.name == targets.GROUP).cases
    assert sorted(c.case_id for c in grid_cases) == sorted(
        f"B{c['batch_size']}-P{c['prefix_len']}-T{c['tree_size']}-H{c['num_heads']}-{c['layout']}"
        for c in target_cases()
    )


def test_the_fixed_peak_moves_the_floor_and_the_count() -> None:
    """At 800 TFLOP/s, below the fixture board's 812.5, every compute-bound floor is 1.6 % longer:
    49.5 % of the board's floor is 50.27 % at 800, and 49.0 % stays under the line."""
    rows = target_rows(full_run({(32768, 8, 16): 49.5, (65536, 8, 16): 49.0, (131072, 8, 16): 36.4}))
    assert sum(t.reached for t in rows) == 21
    assert sum(t.reached_at_peak for t in rows) == 22
    assert rows[0].pct_at_peak == pytest.approx(49.5 * 812.5 / 800)
    assert sum(t.reached_at_peak for t in target_rows(full_run(), peak_tflops=1700.0)) == 0  # 60 % -> 28.7 %


def test_the_count_is_of_cold_rows_at_or_above_the_target(tmp_path: Path) -> None:
    run = full_run({(32768, 8, 16): 36.4, (65536, 8, 16): TARGET_PCT, (131072, 8, 16): 49.99})
    rows = target_rows(run)
    assert sum(t.reached for t in rows) == 22  # 50.0 reaches it; 49.99 and 36.4 do not
    text = markdown(run)
    assert "22 of 24 target cases at >= 50 % of the floor (this board's 812.5 TFLOP/s)" in text
    lines = {tuple(line.split(" | ")[:3]): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 36.4 |" in lines[("| 32768", "8", "16")] and "**36.4**" not in text
    assert "| **50.0** |" in lines[("| 65536", "8", "16")]
    # 49.99 would round to 50.0, the target's other side: two decimals, not bold
    assert "| 49.99 |" in lines[("| 131072", "8", "16")]


def test_a_graph_row_alone_does_not_reach_the_target() -> None:
    rows = [r for r in full_run().sweep if not (r.params["prefix_len"] == 32768 and r.mode == "cold")]
    run = run_of(rows + [row(ISSUE_CASES[0], 90.0, mode="graph")])
    got = target_rows(run)
    assert sum(t.reached for t in got) == 18  # the six P=32k cases have no cold row
    assert cells(got[0])[3] == ("not in this run", False)


def test_the_percentage_at_a_fixed_peak_uses_the_runs_bandwidth_and_that_peak() -> None:
    case = ISSUE_CASES[0]
    r = row(case, 40.0, bytes=4_000_000_000, flops=800_000_000_000_000)
    bw = RUN.ceilings["copy_bandwidth_gbs"]
    t = target_rows(run_of([r]), peak_tflops=800.0)[0]
    floor = max(4e9 / (bw * 1e9), 8e14 / 8e14) * 1e3  # 1000 ms of tensor work at 800 TFLOP/s
    assert t.pct_at_peak == pytest.approx(100 * floor / r.median_ms)
    assert target_rows(run_of([r]), peak_tflops=400.0)[0].pct_at_peak == pytest.approx(2 * t.pct_at_peak)
    with pytest.raises(ResultsError, match="--at-peak"):
        target_rows(run_of([r]), peak_tflops=0.0)


def test_error_rows_and_tp_rank_rows_do_not_count() -> None:
    case = ISSUE_CASES[0]
    err = row(case, 80.0, status="error", samples_ms=[], median_ms=0.0, note="illegal memory access")
    rank = row(ISSUE_CASES[1], 95.0, tp_rank=0, tp_size=2)
    step = row(ISSUE_CASES[2], 95.0, tp_rank=None, tp_size=2)
    one = row(ISSUE_CASES[3], 95.0, tp_rank=None, tp_size=None)
    got = target_rows(run_of([err, rank, step, one]))
    assert not got[0].reached and cells(got[0])[4] == ("error: illegal memory access", False)
    # a TP run's rank and step rows time H/N heads on each of N GPUs: not the one-GPU targets
    assert got[1].cold is None and got[2].cold is None
    assert got[3].reached


def test_a_capped_row_says_how_many_of_its_samples_were_where_they_were_read_one_by_one() -> None:
    case = ISSUE_CASES[0]
    plain, snapshots, read = (row(case, 60.0), row(case, 60.0, throttled=True), row(case, 60.0))
    read = replace(read, throttled=True, throttled_samples=[0, 1, 2], samples_ms=[1.0] * 8)
    clean = replace(plain, throttled_samples=[])
    marks = [cells(target_rows(run_of([r]))[0])[4][0] for r in (plain, snapshots, read, clean)]
    assert [m.partition(" ")[2] for m in marks] == ["", "(capped)", "(capped, 3/8 samples)", ""]
    snapshots_only = replace(snapshots, throttled_samples=[], samples_ms=[1.0] * 8)
    assert cells(target_rows(run_of([snapshots_only]))[0])[4][0].endswith(" (capped, 0/8 samples)")


def test_the_speedup_line_reads_the_baselines_row_of_the_same_case() -> None:
    case = next(c for c in ISSUE_CASES if all(c[k] == v for k, v in SPEEDUP_CASE.items() if k in c))
    mine = row(case, 60.0)
    base = row(case, 60.0, impl=BASELINE)
    fast = replace(base, median_ms=150 * mine.median_ms, samples_ms=[150 * mine.median_ms] * 3)
    slow = replace(fast, median_ms=50 * mine.median_ms, samples_ms=[50 * mine.median_ms] * 3)
    assert "150x (meets the 100x target)" in speedup_line(target_rows(run_of([mine, fast])))
    assert "50x (misses the 100x target)" in speedup_line(target_rows(run_of([mine, slow])))
    assert "was not timed on this case" in speedup_line(target_rows(run_of([mine])))
    assert "not in this run" in speedup_line(target_rows(run_of([])))
    # the baseline's graph row is not its cold row
    assert "was not timed" in speedup_line(target_rows(run_of([mine, replace(fast, mode="graph")])))


def test_the_page_shows_the_table_where_the_run_has_target_cases() -> None:
    page = render_html(RUN, str(SWEEP))
    section = page[page.index('id="targets"') : page.index('id="sweep"')]
    # the committed sweep times three target cases, P=64k H=8 T=16 with the baseline beside it
    assert "of the 3 target cases this run timed (21 not timed)" in section
    assert section.count("<td>not in this run</td>") == 21
    assert "P=200000 H=8 T=16: the kernel&#39;s cold row is not in this run" in section
    assert targets_section(load_results(PARITY))["table"] == ""
    assert 'id="targets"' not in render_html(load_results(PARITY), str(PARITY))


def test_report_targets_on_the_command_line(tmp_path: Path, capsys) -> None:
    assert cli_main(["report", "--targets", str(SWEEP)]) == 0
    out = capsys.readouterr().out
    assert "| P | H | T | config |" in out and "% at 800 TFLOP/s" in out
    assert cli_main(["report", "--targets", "--at-peak", "700", str(SWEEP)]) == 0
    assert "% at 700 TFLOP/s" in capsys.readouterr().out
    # a run without sweep rows is the wrong run given, not a sweep that missed the targets
    assert cli_main(["report", "--targets", str(PARITY)]) == 2
    assert "no sweep rows (a parity run); --targets expects a sweep run" in capsys.readouterr().err
    short = tmp_path / "short"
    short.mkdir()
    write_results(
        run_of([row({"prefix_len": 4096, "num_heads": 8, "tree_size": 16}, 30.0)]), short / "results.json"
    )
    assert cli_main(["report", "--targets", str(short)]) == 0
    assert "no row of verify-attn-cuda on a target case" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert cli_main(["report", "--targets", str(tmp_path / "empty")]) == 2
    assert "no results.json" in capsys.readouterr().err
    assert cli_main(["report", "--targets"]) == 2
    assert "--targets needs a results.json" in capsys.readouterr().err
    assert cli_main(["report", "--targets", "--scaling", str(SWEEP)]) == 2
    assert "separate commands" in capsys.readouterr().err
    assert cli_main(["report", "--at-peak", "700", str(SWEEP)]) == 2
    assert "--at-peak goes with --targets" in capsys.readouterr().err


def test_report_targets_on_a_folder_of_runs_passes_over_its_parity_runs(tmp_path: Path, capsys) -> None:
    """``report --targets reports/``: the folder holds parity runs beside the sweeps; they are
    passed over (each named alone is still the wrong run given, above), not an error that hides
    every table."""
    for name, source in (("a-parity", PARITY), ("b-sweep", SWEEP)):
        (tmp_path / name).mkdir()
        shutil.copy(source, tmp_path / name / "results.json")
    assert cli_main(["report", "--targets", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert (
        f"{tmp_path / 'b-sweep' / 'results.json'}:" in captured.out
        and "| P | H | T | config |" in captured.out
    )
    assert "a-parity" not in captured.out + captured.err


@pytest.mark.parametrize(("value", "message"), [("inf", "a finite number"), ("nan", "a positive number")])
def test_at_peak_must_be_finite_and_positive(value: str, message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["report", "--targets", "--at-peak", value, str(SWEEP)])
    assert exit_.value.code == 2
    assert f"argument --at-peak: expected {message} of TFLOP/s, got '{value}'" in capsys.readouterr().err


def test_the_readmes_target_table_is_the_one_its_run_prints() -> None:
    """README's table of the 24 target cases names the run it comes from; it must be that run's
    table as ``report --targets`` prints it, not numbers copied by hand."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    m = re.search(r"`python -m harness report --targets\s+(reports/\S+?)` prints it\):\n\n", readme)
    assert m, "README names no run for its table of the target cases"
    table = list(itertools.takewhile(lambda line: line.startswith("|"), readme[m.end() :].splitlines()))
    printed = markdown(load_results(_results_of(Path(__file__).parents[1] / m.group(1))))
    assert table == printed.splitlines()[: len(table)] and len(table) == 26


def _results_of(folder: Path) -> Path:
    found = [p for p in (folder / "results.json", folder / "results.json.gz") if p.is_file()]
    assert found, f"{folder}: no results.json(.gz)"
    return found[0]


def test_a_sweep_ends_with_where_the_targets_stand(tmp_path: Path, capsys) -> None:
    from harness import sweep

    sweep.write_sweep_report(full_run({(32768, 8, 16): 36.4}), str(tmp_path / "run"), "default")
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-3:] == [
        "target cases (report --targets):",
        "23 of 24 target cases at >= 50 % of the floor (this board's 812.5 TFLOP/s); 23 at 800 TFLOP/s.",
        "P=200000 H=8 T=16: sglang-triton-ps1 was not timed on this case in this run; no speedup.",
    ]
    # a run without target cases (the sm120 grid's entries, a quick grid) prints nothing of them
    sweep.write_sweep_report(
        run_of([row({"prefix_len": 4096, "num_heads": 8, "tree_size": 16}, 30.0)]),
        str(tmp_path / "short"),
        "quick",
    )
    assert "target cases" not in capsys.readouterr().out
