"""The trend over the committed runs (harness/trend.py, ``report --trend``): which runs it reads,
what a line says, the newest run against the fastest earlier one, and the README's tables of
formal runs checked against the runs they cite."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness import trend
from harness.cli import main as cli_main
from harness.results import Results, ResultsError, write_results
from harness.targets import BASELINE
from tests.test_targets import ISSUE_CASES, full_run, row

pytestmark = pytest.mark.usefixtures("own_git_repositories")

ROOT = Path(__file__).resolve().parents[1]


def a_run(
    day: int,
    pcts: dict | None = None,
    *,
    sha: str = "a",
    gpu: str = "NVIDIA H200",
    command: str = "python -m harness sweep --grid default",
) -> Results:
    run = full_run(pcts)
    environment = {**run.environment, "gpu": {**run.environment["gpu"], "name": gpu}}
    return replace(
        run,
        created_utc=f"2025-12-{day:02d}T10:00:00+00:00",
        git={"sha": sha * 40, "dirty": False},
        command=command,
        environment=environment,
    )


def save(results: Results, folder: Path) -> Path:
    write_results(results, folder / "results.json")
    return folder


def test_the_trend_reads_the_default_grids_runs_per_gpu_model_newest_first(tmp_path: Path) -> None:
    save(a_run(1, sha="1"), tmp_path / "r1")
    save(a_run(3, sha="3"), tmp_path / "r3")
    save(a_run(2, sha="2", gpu="NVIDIA H100 80GB HBM3"), tmp_path / "h100")
    # not read: another grid, a narrowed run of the default grid, a run without target rows
    save(a_run(4, sha="4", command="python -m harness sweep --grid quick"), tmp_path / "quick")
    save(
        a_run(5, sha="5", command="python -m harness sweep --grid default --impls oracle"),
        tmp_path / "narrow",
    )
    save(replace(a_run(6, sha="6"), sweep=[]), tmp_path / "empty")
    groups = trend.trend_runs(tmp_path)
    assert list(groups) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert [r.folder.name for r in groups["NVIDIA H200"]] == ["r3", "r1"]
    assert [r.sha7 for r in groups["NVIDIA H100 80GB HBM3"]] == ["2222222"]


def test_grid_and_impl_follow_another_grid_and_registry_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sm120 grid times sm_120's entries (verify-attn-cuda-small, -small-m32) on the target
    cases; the default grid's runs and the other entry stay out of their trend."""
    save(a_run(1, sha="1"), tmp_path / "default")
    sm120 = a_run(2, {(32768, 8, 16): 20.0}, sha="2", command="python -m harness sweep --grid sm120")
    small = [replace(r, impl="verify-attn-cuda-small") for r in sm120.sweep]
    m32 = [replace(r, impl="verify-attn-cuda-small-m32", median_ms=r.median_ms / 2) for r in sm120.sweep]
    save(replace(sm120, sweep=small + m32), tmp_path / "sm120")
    groups = trend.groups_of(tmp_path, 800.0, grid="sm120", impl="verify-attn-cuda-small")
    (run,) = groups["NVIDIA H200"]
    assert run.folder.name == "sm120" and trend.title("NVIDIA H200", [run]).startswith(
        "NVIDIA H200: 1 run(s) of the sm120 grid, verify-attn-cuda-small, newest first"
    )
    cells = dict(zip(trend.header(800.0), trend.run_cells(run, 800.0), strict=True))
    assert cells["P=32k H=8 T=16 us (% of floor)"].startswith(f"{0.1 * 100 / 20.0 * 1e3:.1f} (20.0 %")
    with pytest.raises(
        ResultsError, match="no tracked sweep run of the 'sm120' grid with a row of verify-attn-cuda "
    ):
        trend.groups_of(tmp_path, 800.0, grid="sm120")
    assert (
        cli_main(["report", "--trend", str(tmp_path), "--grid", "sm120", "--impl", "verify-attn-cuda-small"])
        == 0
    )
    assert "| 2222222 |" in capsys.readouterr().out


def test_a_runs_line_counts_its_targets_and_shows_the_cases_nearest_the_line(tmp_path: Path) -> None:
    pcts = {(32768, 8, 16): 35.0, (65536, 8, 16): 49.96}
    save(a_run(1, pcts, sha="1"), tmp_path / "r1")
    (run,) = trend.trend_runs(tmp_path)["NVIDIA H200"]
    cells = dict(zip(trend.header(800.0), trend.run_cells(run, 800.0), strict=True))
    assert cells["commit"] == "1111111" and cells["run (UTC)"] == "2025-12-01 10:00"
    assert cells["cases >= 50 % (at 800)"].startswith("22 of 24 (")
    us = 0.1 * 100.0 / 35.0 * 1e3  # row()'s median at 35 % of its 0.1 ms floor
    assert cells["P=32k H=8 T=16 us (% of floor)"].startswith(f"{us:.1f} (35.0 %, ")
    # just under the line reads with two decimals, as the targets table has it
    assert cells["P=64k H=8 T=16 us (% of floor)"].split("(")[1].startswith("49.96 %")
    assert cells["folder"] == "r1"


def test_the_speedup_cell_is_the_baselines_time_over_the_kernels_in_the_same_run(tmp_path: Path) -> None:
    run = a_run(1, sha="1")
    case = {"prefix_len": 200000, "num_heads": 8, "tree_size": 16}
    kernel = next(r for r in run.sweep if all(r.params[k] == v for k, v in case.items()) and r.mode == "cold")
    slow = replace(row(case, 1.0, impl=BASELINE), median_ms=30.0, samples_ms=[30.0] * 3)
    save(replace(run, sweep=[*run.sweep, slow]), tmp_path / "r1")
    (line,) = trend.trend_runs(tmp_path)["NVIDIA H200"]
    cells = dict(zip(trend.header(800.0), trend.run_cells(line, 800.0), strict=True))
    assert cells[f"P=200000 H=8 T=16 vs {BASELINE}"] == f"{30.0 / kernel.median_ms:.0f}x (30.00 ms)"


def test_the_newest_run_is_set_against_the_fastest_earlier_run_of_each_case(tmp_path: Path) -> None:
    save(a_run(1, {(32768, 8, 16): 40.0}, sha="1"), tmp_path / "r1")
    save(a_run(2, {(32768, 8, 16): 50.0}, sha="2"), tmp_path / "r2")  # the fastest at P=32k
    save(a_run(3, {(32768, 8, 16): 45.0}, sha="3"), tmp_path / "r3")  # the newest
    runs = trend.trend_runs(tmp_path)["NVIDIA H200"]
    head, rows = trend.best_rows(runs)
    assert head[1] == "newest us (3333333)"
    lines = {r[0]: r for r in rows}
    assert len(lines) == len(ISSUE_CASES)
    newest, fastest = 0.1 * 100 / 45.0 * 1e3, 0.1 * 100 / 50.0 * 1e3
    assert lines["P=32k H=8 T=16"][1:] == [
        f"{newest:.1f}",
        f"{fastest:.1f} (2222222, 2025-12-02)",
        f"{100 * (newest / fastest - 1):+.1f} %",
    ]
    # every run at 60 % elsewhere: no change
    assert lines["P=64k H=8 T=16"][3] == "+0.0 %"


def test_one_run_has_no_earlier_run_to_be_set_against(tmp_path: Path) -> None:
    save(a_run(1, sha="1"), tmp_path / "r1")
    text = trend.markdown(trend.groups_of(tmp_path, 800.0))
    assert "## NVIDIA H200: 1 run(s) of the default grid, newest first" in text
    assert "fastest earlier" not in text


def test_gpu_model_keeps_the_models_whose_name_holds_it_and_refuses_a_name_that_matches_none(
    tmp_path: Path,
) -> None:
    save(a_run(1, sha="1"), tmp_path / "r1")
    save(a_run(2, sha="2", gpu="NVIDIA H100 80GB HBM3"), tmp_path / "h100")
    assert list(trend.groups_of(tmp_path, 800.0, gpu_filter="h100")) == ["NVIDIA H100 80GB HBM3"]
    with pytest.raises(ResultsError, match="of a GPU model named like 'B200'"):
        trend.groups_of(tmp_path, 800.0, gpu_filter="B200")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trend", "{root}", "{root}/r1"], "error: --trend DIR takes no other paths"),
        (["--gpu-model", "H200", "{root}/r1"], "error: --gpu-model goes with --trend"),
        (["--html", "{root}/t.html", "{root}/r1"], "error: --html goes with --trend"),
        (["--grid", "sm120", "{root}/r1"], "error: --grid goes with --trend"),
        (["--impl", "verify-attn-cuda-small", "{root}/r1"], "error: --impl goes with --trend"),
        (["--trend", ""], "error: --trend is empty"),
        (["--trend", "{root}/r1/results.json"], "results.json: a file; expected the reports folder"),
        (["--trend", "{root}/nothing"], "nothing: no such file or folder"),
        (["--trend", "{root}/r1/empty"], "no tracked sweep run of the 'default' grid"),
    ],
)
def test_report_trend_refuses_what_it_cannot_read_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    save(a_run(1, sha="1"), tmp_path / "r1")
    (tmp_path / "r1" / "empty").mkdir()
    assert cli_main(["report", *(a.format(root=tmp_path) for a in argv)]) == 2
    assert message in capsys.readouterr().err


def test_report_trend_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(a_run(1, sha="1"), tmp_path / "r1")
    save(a_run(2, sha="2"), tmp_path / "r2")
    assert cli_main(["report", "--trend", str(tmp_path), "--at-peak", "700"]) == 0
    out = capsys.readouterr().out
    assert "| commit | run (UTC) | GPUs | board TFLOP/s | copy GB/s | cases >= 50 % (at 700) |" in out
    assert out.index("| 2222222 |") < out.index("| 1111111 |")
    assert "| `r2` |" in out


def test_the_trend_page_holds_a_plot_and_both_tables_per_gpu_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    save(a_run(1, sha="1"), runs / "r1")
    save(a_run(2, sha="2"), runs / "r2")
    save(a_run(3, sha="3", gpu="NVIDIA H100 80GB HBM3"), runs / "h100")
    page = tmp_path / "out" / "trend.html"
    assert cli_main(["report", "--trend", str(runs), "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().out
    text = page.read_text()
    assert text.count('src="data:image/png;base64,') == 2  # one plot per GPU model
    assert "NVIDIA H200: 2 run(s) of the default grid, newest first" in text
    assert "NVIDIA H100 80GB HBM3: 1 run(s) of the default grid, newest first" in text
    assert text.count("fastest earlier us") == 1  # only the H200 has an earlier run
    assert "<td>r2</td>" in text and "<td>2222222</td>" in text
    assert not list(page.parent.glob(".*.tmp"))


def test_a_trend_page_that_cannot_be_written_exits_2_naming_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(a_run(1, sha="1"), tmp_path / "r1")
    folder = tmp_path / "taken"
    folder.mkdir()
    assert cli_main(["report", "--trend", str(tmp_path / "r1"), "--html", str(folder)]) == 2
    assert f"error: --html {folder}: cannot write the page there" in capsys.readouterr().err


# --- the README's tables of formal runs, against the runs they cite -----------------------------

# Each table: its header's first cells, the GPU model of its runs, and its columns of the H=8 T=16
# cases (the trend's SHOWN_CASES, in order).
README_TABLES = {
    "| commit | kernel | board TFLOP/s |": ("NVIDIA H200", ("P=32k us (%)", "P=64k us (%, at 800)")),
    "| commit | board TFLOP/s | GPU tests |": ("NVIDIA H100 80GB HBM3", ("P=32k us (%)",)),
}


def _as_written(value: float, text: str) -> bool:
    """Whether ``value`` reads ``text`` at the number of decimals ``text`` has."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{value:.{decimals}f}" == text


def readme_mismatches(readme: str, groups: dict[str, list[trend.TrendRun]]) -> tuple[list[str], int]:
    """Every cell of the README's run tables that disagrees with the committed run of its commit
    (a row agrees when one run of its commit and GPU model agrees in every cell), and how many
    cells were checked. A cell that does not parse (a note, two boards' figures) is not checked;
    a row whose commit has no committed run of that model is a mismatch."""
    lines = readme.splitlines()
    mismatches, checked = [], 0
    for start, (model, case_columns) in README_TABLES.items():
        at = next(i for i, line in enumerate(lines) if line.startswith(start))
        names = [c.strip() for c in lines[at].strip().strip("|").split("|")]
        for line in lines[at + 2 :]:
            if not line.startswith("|"):
                break
            cell = dict(zip(names, (c.strip() for c in line.strip().strip("|").split("|")), strict=True))
            sha = cell["commit"].split()[0]
            candidates = [r for r in groups.get(model, []) if r.sha7 == sha]
            if not candidates:
                mismatches.append(f"{model} {sha}: no committed run of the default grid")
                continue
            found = [_row_mismatches(run, cell, case_columns) for run in candidates]
            checked += min(n for _, n in found)
            if all(bad for bad, _ in found):
                mismatches.append(f"{model} {sha}: {found[0][0]}")
    return mismatches, checked


def _row_mismatches(run: trend.TrendRun, cell: dict[str, str], case_columns: tuple[str, ...]):
    bad, checked = [], 0

    def check(what: str, value: float | None, text: str) -> None:
        nonlocal checked
        checked += 1
        if value is None or not _as_written(value, text):
            bad.append(f"{what} reads {text}, the run {value}")

    timed = [t for t in run.targets if t.cold is not None and t.cold.timed]
    board = cell.get("board TFLOP/s", "")
    if re.fullmatch(r"[\d.]+", board):
        check("board TFLOP/s", run.results.ceilings.get("bf16_tflops"), board)
    cases = cell.get("cases >= 50 %", "")
    if m := re.match(r"(\d+) of 24", cases):
        check("cases >= 50 %", sum(t.reached for t in timed), m.group(1))
    if m := re.search(r"\((\d+) at 800\)", cases):
        check("cases at 800", sum(t.reached_at_peak for t in timed), m.group(1))
    for column, case in zip(case_columns, trend.SHOWN_CASES, strict=False):
        m = re.fullmatch(r"([\d.]+)?\s*\(([\d.]+)(?:, ([\d.]+))?\)", cell.get(column, ""))
        if not m:
            continue
        t = run.target(case)
        us, pct, at_peak = m.groups()
        if t is None or t.cold is None:
            bad.append(f"{column}: the run has no such row")
            continue
        if us:
            check(f"{column} us", t.cold.median_ms * 1e3, us)
        check(f"{column} %", t.cold.pct_of_floor, pct)
        if at_peak:
            check(f"{column} at 800", t.pct_at_peak, at_peak)
    if m := re.fullmatch(r"(\d+)x \(([\d.]+) ms\)", cell.get("vs SGLang", "")):
        t = run.target(trend.SPEEDUP_CASE)
        base = None if t is None else t.baselines.get(BASELINE)
        if t is None or t.cold is None or base is None:
            bad.append("vs SGLang: the run has no such rows")
        else:
            check("vs SGLang", base.median_ms / t.cold.median_ms, m.group(1))
            check("SGLang ms", base.median_ms, m.group(2))
    return bad, checked


@pytest.fixture(scope="module")
def committed_groups() -> dict[str, list[trend.TrendRun]]:
    return trend.trend_runs(ROOT / "reports")


def test_the_readmes_tables_of_formal_runs_agree_with_the_runs_they_cite(committed_groups) -> None:
    mismatches, checked = readme_mismatches(
        (ROOT / "README.md").read_text(encoding="utf-8"), committed_groups
    )
    assert mismatches == []
    assert checked >= 150  # 26 rows, most with 5-8 figures: the check is not vacuous


@pytest.mark.parametrize(
    ("written", "changed"),
    [
        ("| fed1f3e | v78 | 807.8 |", "| fed1f3e | v78 | 807.9 |"),
        (
            "31.9 (35.4) | 45.2 (49.95, 50.4) | 289x (32.74 ms)",
            "31.9 (35.4) | 45.2 (49.95, 50.5) | 289x (32.74 ms)",
        ),
        ("| 289x (32.74 ms) | `20261207T130514", "| 298x (32.74 ms) | `20261207T130514"),
        ("| 23 of 24 | 31.5 (39.5) |", "| 23 of 24 | 31.5 (39.6) |"),
        ("| 212b73f | 809.4 |", "| 212b73e | 809.4 |"),
    ],
)
def test_the_readme_check_catches_a_figure_that_drifts_from_its_run(
    committed_groups, written: str, changed: str
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert written in readme
    mismatches, _ = readme_mismatches(readme.replace(written, changed, 1), committed_groups)
    assert len(mismatches) == 1
