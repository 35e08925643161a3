"""The kernel's history on each GPU model: one line per committed run of the default grid.

    python -m harness report --trend reports/ [--gpu-model SUBSTRING] [--at-peak TFLOPS]
                                              [--grid sm120 --impl verify-attn-cuda-small]

``compare`` judges two runs; a slowdown that comes a little at a time, under its 3 % minimum
effect at every step, passes every pair. This reads every sweep run of the default grid that the
history gate reads (the runs git tracks or would track, :func:`harness.compare.tracked_results`)
and prints, per GPU model, newest first, a markdown table with a line per run:

- the commit, the run's date and how many GPUs it was dealt over;
- the board's measured bf16 peak and copy bandwidth, on which its floors rest;
- how many of the 24 target cases (:mod:`harness.targets`) reach 50 % of this board's floor and
  of the floor at a fixed peak (``--at-peak``, 800 TFLOP/s by default, to compare boards);
- P=32k and P=64k H=8 T=16 (the target cases nearest the line) with their % of floor, and
  P=200k H=8 T=16's speedup over SGLang Triton timed in the same run;
- the H=8 T=16 series' line (:mod:`harness.scaling`): its fixed cost and steady % of floor;
- the run's folder.

Below it, per target case, the newest run's median against the fastest earlier run of the same
GPU model: how far the newest run sits from the best this kernel has shown there. Boards of one
model differ by 1-3 % and by their power caps, so a few per cent there is the boards as much as
the code; the line is shown, never gated.

``--grid`` and ``--impl`` follow another grid that times the target cases and another registry
entry of the kernel: ``--grid sm120 --impl verify-attn-cuda-small`` (or ``-small-m32``) is the
mma.sync path that sm_120 runs, timed on whatever GPU ran the grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.compare import gpu_model, run_grid, sha7_of, tracked_results_of_folder
from harness.results import Results, ResultsError, load_results
from harness.scaling import ScalingFit, fits, prefix_text
from harness.targets import (
    BASELINE,
    DEFAULT_PEAK_TFLOPS,
    IMPL,
    TARGET_PCT,
    TargetRow,
    pct_text,
    target_rows,
)
from harness.text import markdown_table

GRID = "default"  # the grid whose targets group holds the target cases
SERIES = {"batch_size": 1, "num_heads": 8, "tree_size": 16, "tree": "eagle", "layout": "shuffled"}
SHOWN_CASES = ({"prefix_len": 32768, **SERIES}, {"prefix_len": 65536, **SERIES})
SPEEDUP_CASE = {"prefix_len": 200000, **SERIES}


@dataclass(frozen=True)
class TrendRun:
    """One run as the trend shows it."""

    folder: Path
    results: Results
    grid: str
    impl: str  # the kernel's registry entry whose rows the line reads
    targets: list[TargetRow]  # :func:`harness.targets.target_rows` at the trend's peak
    series: ScalingFit | None  # the H=8 T=16 series' cold line of the kernel; None: not fitted

    @property
    def sha7(self) -> str:
        return sha7_of(self.results)

    @property
    def gpus(self) -> int:
        listed = self.results.environment.get("gpus")
        return len(listed) if isinstance(listed, list) and listed else 1

    def target(self, case: dict[str, object]) -> TargetRow | None:
        return next((t for t in self.targets if all(t.case.get(k) == v for k, v in case.items())), None)


def _matches(fit: ScalingFit, impl: str) -> bool:
    params = dict(fit.params)
    return fit.impl == impl and fit.mode == "cold" and all(params.get(k) == v for k, v in SERIES.items())


def trend_runs(
    root: Path, peak_tflops: float = DEFAULT_PEAK_TFLOPS, grid: str = GRID, impl: str = IMPL
) -> dict[str, list[TrendRun]]:
    """Every tracked sweep run of ``grid`` under ``root`` with a row of ``impl`` on a target case,
    per GPU model, newest first. ResultsError when ``root`` is not a folder of runs or a results
    file cannot be read."""
    files = tracked_results_of_folder(root, "--trend")
    groups: dict[str, list[TrendRun]] = {}
    for path in files:
        results = load_results(path)
        if results.kind != "sweep" or run_grid(results) != grid:
            continue
        targets = target_rows(results, peak_tflops, impl=impl)
        if not any(t.cold is not None for t in targets):
            continue
        series = next((f for f in fits(results) if _matches(f, impl)), None)
        run = TrendRun(path.parent, results, grid, impl, targets, series)
        groups.setdefault(gpu_model(results), []).append(run)
    for runs in groups.values():
        runs.sort(key=lambda r: r.results.created_utc, reverse=True)
    return dict(sorted(groups.items()))


def _timed(t: TargetRow | None) -> bool:
    return t is not None and t.cold is not None and t.cold.timed


def _case_cell(t: TargetRow | None, peak_tflops: float) -> str:
    """``31.9 (35.4 %, 35.8 at 800)``: the median us, % of this board's floor and at the peak."""
    if not _timed(t):
        return "-"
    assert t is not None and t.cold is not None
    at = "" if t.pct_at_peak is None else f", {pct_text(t.pct_at_peak)} at {peak_tflops:g}"
    pct = "-" if t.cold.pct_of_floor is None else pct_text(t.cold.pct_of_floor)
    return f"{t.cold.median_ms * 1e3:.1f} ({pct} %{at})"


def _speedup_cell(t: TargetRow | None) -> str:
    if not _timed(t):
        return "-"
    assert t is not None and t.cold is not None
    base = t.baselines.get(BASELINE)
    return "-" if base is None else f"{base.median_ms / t.cold.median_ms:.0f}x ({base.median_ms:.2f} ms)"


def _series_cell(f: ScalingFit | None) -> str:
    if f is None:
        return "-"
    steady = "-" if f.steady_pct is None else f"{f.steady_pct:.1f} %"
    return f"{f.fixed_ms * 1e3:.1f} us, {steady}"


def _ceiling(results: Results, key: str, digits: int) -> str:
    value = (results.ceilings or {}).get(key)
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def case_name(case: dict[str, object]) -> str:
    return f"P={prefix_text(int(case['prefix_len']))} H={case['num_heads']} T={case['tree_size']}"


def run_cells(run: TrendRun, peak_tflops: float) -> list[str]:
    """A run's line of the trend table, in :func:`header`'s order."""
    r = run.results
    timed = [t for t in run.targets if _timed(t)]
    reached = sum(t.reached for t in timed)
    at_peak = sum(t.reached_at_peak for t in timed)
    of = f"{len(run.targets)}" if len(timed) == len(run.targets) else f"{len(timed)} timed"
    return [
        run.sha7,
        r.created_utc[:16].replace("T", " "),
        str(run.gpus),
        _ceiling(r, "bf16_tflops", 1),
        _ceiling(r, "copy_bandwidth_gbs", 0),
        f"{reached} of {of} ({at_peak} at {peak_tflops:g})",
        *(_case_cell(run.target(c), peak_tflops) for c in SHOWN_CASES),
        _speedup_cell(run.target(SPEEDUP_CASE)),
        _series_cell(run.series),
        run.folder.name,
    ]


def header(peak_tflops: float) -> list[str]:
    return [
        "commit",
        "run (UTC)",
        "GPUs",
        "board TFLOP/s",
        "copy GB/s",
        f"cases >= {TARGET_PCT:g} % (at {peak_tflops:g})",
        *(f"{case_name(c)} us (% of floor)" for c in SHOWN_CASES),
        f"{case_name(SPEEDUP_CASE)} vs {BASELINE}",
        "H=8 T=16 series: fixed, steady",
        "folder",
    ]


def pct_at_peak_series(runs: Sequence[TrendRun]) -> dict[str, list[float | None]]:
    """Per target case (by :func:`case_name`), its % of the floor at the trend's peak in each of
    ``runs``, in their order; None where a run did not time it."""
    series: dict[str, list[float | None]] = {}
    for index, run in enumerate(runs):
        for t in run.targets:
            values = series.setdefault(case_name(t.case), [None] * len(runs))
            values[index] = t.pct_at_peak if _timed(t) else None
    return series


def best_rows(runs: Sequence[TrendRun]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per target case the newest run's median against the fastest earlier
    run's; no rows where no earlier run timed a case the newest one did."""
    newest, earlier = runs[0], runs[1:]
    rows = []
    for t in newest.targets:
        if not _timed(t):
            continue
        assert t.cold is not None
        found = [(o, o.target(t.case)) for o in earlier]
        timed = [(o, u) for o, u in found if _timed(u)]
        if not timed:
            continue
        run, best = min(timed, key=lambda pair: pair[1].cold.median_ms)  # type: ignore[union-attr]
        assert best is not None and best.cold is not None
        change = t.cold.median_ms / best.cold.median_ms - 1.0
        rows.append(
            [
                case_name(t.case),
                f"{t.cold.median_ms * 1e3:.1f}",
                f"{best.cold.median_ms * 1e3:.1f} ({run.sha7}, {run.results.created_utc[:10]})",
                f"{100 * change:+.1f} %",
            ]
        )
    return ["case", f"newest us ({newest.sha7})", "fastest earlier us (commit, date)", "change"], rows


PAGE_NOTE = (
    "compare gates pairs of runs at a 3 % minimum effect; this shows what a run of small steps "
    "adds up to. Each board's floor rests on its own measured peak and bandwidth; the plot fixes "
    "the peak so that boards compare. Shown, not gated."
)
BEST_NOTE = (
    "The newest run against the fastest earlier run of each target case (cold median; boards "
    "differ by 1-3 % and by their power caps: shown, not gated)"
)


def groups_of(
    root: Path, peak_tflops: float, gpu_filter: str | None = None, grid: str = GRID, impl: str = IMPL
) -> dict[str, list[TrendRun]]:
    """:func:`trend_runs` of the GPU models whose name holds ``gpu_filter`` (case-insensitive).
    ResultsError when no such run is there, or none of such a model."""
    groups = trend_runs(root, peak_tflops, grid, impl)
    if gpu_filter is not None:
        groups = {m: runs for m, runs in groups.items() if gpu_filter.lower() in m.lower()}
    if not groups:
        which = "" if gpu_filter is None else f" of a GPU model named like {gpu_filter!r}"
        raise ResultsError(
            f"{root}: no tracked sweep run of the {grid!r} grid with a row of {impl} on a target case{which}"
        )
    return groups


def title(model: str, runs: Sequence[TrendRun]) -> str:
    impl = "" if runs[0].impl == IMPL else f", {runs[0].impl}"
    return f"{model}: {len(runs)} run(s) of the {runs[0].grid} grid{impl}, newest first"


def markdown(groups: dict[str, list[TrendRun]], peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> str:
    """The trend of each GPU model of ``groups`` (:func:`groups_of`) as markdown."""
    out = []
    for model, runs in groups.items():
        out += [f"## {title(model, runs)}", ""]
        rows = [run_cells(r, peak_tflops) for r in runs]
        out += markdown_table(header(peak_tflops), [[*cells[:-1], f"`{cells[-1]}`"] for cells in rows])
        best_head, best = best_rows(runs)
        if best:
            out += ["", f"{BEST_NOTE}:", "", *markdown_table(best_head, best)]
        out.append("")
    return "\n".join(out)
