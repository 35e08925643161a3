"""The kernel's performance targets in one table, from a sweep's ``results.json``.

    python -m harness report --targets PATH [--at-peak TFLOPS]

The targets are the cases of the default grid's ``targets`` group (``harness/grids/default.toml``:
B=1, P in {32k, 64k, 128k, 200k}, H in {8, 16, 64}, T in {16, 64}, EAGLE trees, shuffled slots),
each to reach >= ``TARGET_PCT`` % of its roofline floor, and P=200k H=8 T=16 to run
>= ``TARGET_SPEEDUP``x faster than SGLang's Triton kernel timed in the same run. Per target case
the table gives the kernel's cold row (its tile config, median, % of this board's floor), the
% of the floor at a fixed bf16 peak (``--at-peak``, 800 TFLOP/s by default: the boards lent for
the runs measure 714.6-806.0, and a fixed peak compares runs across boards), TFLOP/s, the graph row's
median, and the speedup over each baseline that the run timed on the same case. Below it: how
many cases reach the target, against either peak, and the speedup target's case.

Rows of a run dealt over several GPUs are read as they are (each case ran on one GPU). A TP run's
rows are not read at all: its steps time N GPUs at once, each with H/N heads, and the targets are
calls on one GPU. A case the run lacks, or whose row is an error row, is listed as such and counts
as not reaching the target. Nothing here gates:
``harness compare`` is the gate between runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results import Results, ResultsError, SweepRow
from harness.text import markdown_table

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

GRID_FILE = Path(__file__).parent / "grids" / "default.toml"  # whose targets group is the target cases
GROUP = "targets"
IMPL = "verify-attn-cuda"
BASELINE = "sglang-triton-ps1"
TARGET_PCT = 50.0
TARGET_SPEEDUP = 100.0
SPEEDUP_CASE = {"batch_size": 1, "prefix_len": 200000, "num_heads": 8, "tree_size": 16}
DEFAULT_PEAK_TFLOPS = 800.0
# A grid group's axes and the defaults of the ones it may leave out, as harness/sweep.py reads them
# (not imported from there: that module loads torch, and a report reads results without it).
AXES = ("batch_size", "prefix_len", "num_heads", "tree_size", "tree", "layout")
DEFAULT_AXES = {"tree": ["eagle"], "layout": ["shuffled"]}


def target_cases(grid_file: Path = GRID_FILE) -> list[dict[str, Any]]:
    """The params of every case of the grid's ``targets`` group, P outermost, then H, then T."""
    try:
        doc = tomllib.loads(grid_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ResultsError(f"{grid_file}: cannot read the target cases: {e}") from e
    groups = [g for g in doc.get("group", []) if isinstance(g, dict) and g.get("name") == GROUP]
    if len(groups) != 1:
        raise ResultsError(f"{grid_file}: expected one [[group]] named {GROUP!r}, found {len(groups)}")
    group = groups[0]
    axes = {a: group.get(a, DEFAULT_AXES.get(a)) for a in AXES}
    missing = [a for a, v in axes.items() if not isinstance(v, list) or not v]
    if missing:
        raise ResultsError(f"{grid_file}, group {GROUP!r}: missing or empty axes {missing}")
    order = ("prefix_len", "num_heads", "tree_size", "batch_size", "tree", "layout")
    cases = []
    for combo in itertools.product(*(axes[a] for a in order)):
        cases.append(dict(zip(order, combo, strict=True)))
    return cases


def _matches(row: SweepRow, case: dict[str, Any]) -> bool:
    return all(row.params.get(k) == v for k, v in case.items())


@dataclass(frozen=True)
class TargetRow:
    case: dict[str, Any]
    cold: SweepRow | None  # the kernel's cold row; None: the run lacks it
    graph: SweepRow | None
    baselines: dict[str, SweepRow]  # other implementations' cold rows of the same case, timed
    pct_at_peak: float | None  # % of the floor with the tensor peak fixed at --at-peak

    @property
    def reached(self) -> bool:
        return self.cold is not None and self.cold.timed and (self.cold.pct_of_floor or 0.0) >= TARGET_PCT

    @property
    def reached_at_peak(self) -> bool:
        return self.pct_at_peak is not None and self.pct_at_peak >= TARGET_PCT


def _floor_at_peak_ms(row: SweepRow, copy_gbs: float | None, peak_tflops: float) -> float | None:
    """harness.roofline.floor_ms's rule with the peak given (that module loads torch)."""
    if not copy_gbs or copy_gbs <= 0:
        return None
    return max(row.bytes / (copy_gbs * 1e9), row.flops / (peak_tflops * 1e12)) * 1e3


def target_rows(
    results: Results,
    peak_tflops: float = DEFAULT_PEAK_TFLOPS,
    cases: Sequence[dict[str, Any]] | None = None,
    impl: str = IMPL,
) -> list[TargetRow]:
    """One :class:`TargetRow` per target case (P, then H, then T), from the run's one-GPU rows of
    ``impl`` (the kernel's registry entry; the others' cold rows are its baselines)."""
    if not peak_tflops > 0:
        raise ResultsError(f"--at-peak must be a positive TFLOP/s figure, got {peak_tflops!r}")
    copy_gbs = (results.ceilings or {}).get("copy_bandwidth_gbs")
    rows = [r for r in results.sweep if r.tp_rank is None and (r.tp_size or 1) == 1]
    out = []
    for case in cases if cases is not None else target_cases():
        mine = [r for r in rows if _matches(r, case)]

        def pick(impl: str, mode: str, mine: list[SweepRow] = mine) -> SweepRow | None:
            return next((r for r in mine if r.impl == impl and r.mode == mode), None)

        cold = pick(impl, "cold")
        pct = None
        if cold is not None and cold.timed:
            floor = _floor_at_peak_ms(cold, copy_gbs, peak_tflops)
            pct = None if floor is None else 100.0 * floor / cold.median_ms
        baselines = {r.impl: r for r in mine if r.impl != impl and r.mode == "cold" and r.timed}
        out.append(TargetRow(case, cold, pick(impl, "graph"), baselines, pct))
    return out


def any_target(rows: Sequence[TargetRow]) -> bool:
    """Whether the run of ``rows`` (:func:`target_rows`) timed the kernel on at least one target
    case (on one GPU: not a TP run)."""
    return any(t.cold is not None for t in rows)


def _case_text(case: dict[str, Any]) -> str:
    return f"P={case['prefix_len']} H={case['num_heads']} T={case['tree_size']}"


def capped_mark(r: SweepRow) -> str:
    """`` (capped)`` after a throttled row's time, `` (capped, 12/40 samples)`` where its samples
    were read one by one (``0/40``: the row's snapshots alone saw a cap); "" for a row that was
    not throttled."""
    if not r.throttled:
        return ""
    return " (capped)" if r.capped_count is None else f" (capped, {r.capped_count} samples)"


CAPPED_NOTE = (
    '"capped": NVML reported a throttle (e.g. the power cap) before, during or after the row\'s samples; '
    '"capped, k/n samples": during k of its n samples, where they were read one by one.'
)
HEADER = ("P", "H", "T", "config", "median us", "% of floor", "% at {peak} TFLOP/s", "TFLOP/s", "graph us")


def header(peak_tflops: float) -> list[str]:
    return [h.format(peak=f"{peak_tflops:g}") for h in HEADER] + [f"vs {BASELINE}"]


def pct_text(value: float) -> str:
    """A % of floor to one decimal, or to two where one would round it onto the target's side it
    is not on (49.96 reads "49.96", not "50.0")."""
    text = f"{value:.1f}"
    return text if (float(text) >= TARGET_PCT) == (value >= TARGET_PCT) else f"{value:.2f}"


def cells(t: TargetRow) -> list[tuple[str, bool]]:
    """A target row's cells as (text, reaches the target) pairs, in :func:`header`'s order; the
    flag is True only on a % of floor at or above the target."""
    c = t.case
    out = [(str(c["prefix_len"]), False), (str(c["num_heads"]), False), (str(c["tree_size"]), False)]
    if t.cold is None:
        return out + [("not in this run", False)] + [("", False)] * 6
    r = t.cold
    if not r.timed:
        return (
            out
            + [(r.impl_config or "-", False), (f"error: {r.note or 'no samples'}", False)]
            + [("", False)] * 5
        )

    def pct(value: float | None) -> tuple[str, bool]:
        return ("-", False) if value is None else (pct_text(value), value >= TARGET_PCT)

    base = t.baselines.get(BASELINE)
    return out + [
        (r.impl_config or "-", False),
        (f"{r.median_ms * 1e3:.1f}" + capped_mark(r), False),
        pct(r.pct_of_floor),
        pct(t.pct_at_peak),
        ("-" if r.tflops is None else f"{r.tflops:.0f}", False),
        (f"{t.graph.median_ms * 1e3:.1f}" if t.graph is not None and t.graph.timed else "-", False),
        (f"{base.median_ms / r.median_ms:.0f}x ({base.median_ms:.2f} ms)" if base is not None else "", False),
    ]


def count_line(results: Results, rows: Sequence[TargetRow], peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> str:
    board = (results.ceilings or {}).get("bf16_tflops")
    board_text = f"{board:.1f} TFLOP/s" if isinstance(board, (int, float)) else "its measured peak"
    timed = sum(t.cold is not None and t.cold.timed for t in rows)
    of = (
        f"{len(rows)} target cases"
        if timed == len(rows)
        else f"the {timed} target cases this run timed ({len(rows) - timed} not timed)"
    )
    return (
        f"{sum(t.reached for t in rows)} of {of} at >= {TARGET_PCT:g} % of the floor "
        f"(this board's {board_text}); {sum(t.reached_at_peak for t in rows)} at {peak_tflops:g} TFLOP/s."
    )


def markdown(
    results: Results, peak_tflops: float = DEFAULT_PEAK_TFLOPS, rows: Sequence[TargetRow] | None = None
) -> str:
    """The target table (markdown, a reached % of floor in bold) and the lines that count it;
    ``rows``: the run's :func:`target_rows` at ``peak_tflops`` where the caller has them."""
    rows = target_rows(results, peak_tflops) if rows is None else rows
    lines = markdown_table(
        header(peak_tflops), [[f"**{text}**" if hit else text for text, hit in cells(t)] for t in rows]
    )
    lines += ["", f"{count_line(results, rows, peak_tflops)} {CAPPED_NOTE}", speedup_line(rows)]
    return "\n".join(lines)


def speedup_line(rows: Sequence[TargetRow]) -> str:
    """The speedup target's verdict from the run's own rows."""
    name = _case_text(SPEEDUP_CASE)
    t = next((t for t in rows if all(t.case.get(k) == v for k, v in SPEEDUP_CASE.items())), None)
    if t is None or t.cold is None or not t.cold.timed:
        return f"{name}: the kernel's cold row is not in this run (or is an error row)."
    base = t.baselines.get(BASELINE)
    if base is None:
        return f"{name}: {BASELINE} was not timed on this case in this run; no speedup."
    ratio = base.median_ms / t.cold.median_ms
    verdict = "meets" if ratio >= TARGET_SPEEDUP else "misses"
    return (
        f"{name}: {t.cold.median_ms * 1e3:.1f} us against {BASELINE}'s {base.median_ms:.2f} ms in the same "
        f"run, {ratio:.0f}x ({verdict} the {TARGET_SPEEDUP:g}x target)."
    )
