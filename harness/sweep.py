"""``python -m harness sweep``: time every available implementation over a grid of cases.

    python -m harness sweep [--grid quick|default|full|sm120|PATH.toml] [--impls a,b] [--modes cold,graph]
                            [--case-filter SUBSTR] [--out DIR] [--list] [--device cuda|cpu]
                            [--gpus all|N | --tp N | --shard K/N] [--worker-timeout S]

Grids live in ``harness/grids/*.toml`` (or any TOML file with the same layout)::

    description = "what this grid is for"
    [timing]              # harness.timing.measure arguments for every group
    warmup = 5
    min_samples = 20
    max_samples = 200
    max_time_s = 2.0      # device time per case, implementation and mode
    rel_ci = 0.01
    [reference]
    max_gflop = 10.0      # the reference implementation is timed only on cases up to this size
    [[group]]             # every combination of the axes below is a case
    name = "main"
    batch_size = [1]
    prefix_len = [4096, 65536]
    num_heads = [8, 64]
    tree_size = [16]
    tree = ["eagle"]      # optional: chain | eagle | ddtree | random (default eagle)
    layout = ["shuffled"] # optional: contiguous | shuffled (default shuffled)
    impls = ["..."]       # optional: only these implementations time this group (default all)
    modes = ["cold"]      # optional (default cold and graph)
    [group.timing]        # optional overrides of [timing] for this group
    max_samples = 10

A case and implementation may appear in one group only. ``--case-filter`` keeps the cases whose
id contains SUBSTR, or only the case whose id equals it. Every registered implementation that is
available on the device runs, unless ``--impls`` or the group narrows the set; the reference
implementation (``is_reference``) is skipped above ``max_gflop``, and the run's notes say where.

Per case the batch is built once on the device; before timing, every implementation runs once and
an output with NaN or Inf is recorded as an error row and never timed. Rows carry the raw samples
(4 significant digits), statistics, bytes, FLOPs, the roofline floor, speedups over the other
implementations of the same case and mode, NVML state before and after, and a repro command.
A CUDA run holds the box's GPU lock throughout (:func:`harness.timing.exclusive_gpu`; a CPU run
takes none) and writes ``reports/<UTC time>-sweep-<grid>-<gpu>-<sha7>/`` (results.json +
index.html) unless ``--out``. A case whose batch cannot be built (out of memory, say) is an
error row for each of its implementations and modes, and the sweep goes on to the next case.

Modes: ``cold`` times eager calls, ``graph`` CUDA-graph replays; both on a cold L2 (the method
is in :mod:`harness.timing`). A progress bar shows the case, implementation and mode being timed
and the time left. ``--device cpu`` runs the plumbing with the host clock (no graph mode, no
ceilings, no NVML): for checking a grid or an implementation's wiring, not for numbers; there
``--list`` shows the cold runs only, as they are what runs.

Several GPUs (:mod:`harness.shard`): ``--gpus all|N`` deals the cases to N GPUs, one worker
process per GPU, and merges their rows into one report; ``--tp N`` times every case
tensor-parallel on N GPUs at once (H/N heads each, the same KV); ``--shard K/N`` is the worker
mode that times shard K of N alone.

Before timing anything the sweep checks that it has something to time (a case that
``--case-filter`` keeps, a mode that runs on the device) and that the report's folder can be
created and written; if not, it exits 2 naming the option and writes nothing. Implementations
unavailable on the box are recorded in the report's ``unavailable`` list; a run whose every
implementation is unavailable exits 2 naming each with its reason, and writes nothing. A
``--gpus``/``--tp`` run leaves availability to its workers, on their GPUs (one may be dealt a
share of nothing): there such a run writes a report of 0 rows, its ``unavailable`` list saying
why, and exits 0.

Exit status: 0 when every row was timed, 1 when any row is an error or the report could not be
written (its results are then kept elsewhere, named on stderr), 2 on bad arguments, 3 when a
worker of a ``--gpus``/``--tp`` run failed (no report is written then).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from harness import nvml, registry
from harness.cases import LAYOUTS, TREE_KINDS, CaseParams, build_batch
from harness.cli import check_run_out_dir, positive_number, shown
from harness.env import environment, git_info
from harness.registry import Implementation, RunFn, impl_config_of
from harness.results import REPORTS_DIR as REPORTS_DIR  # the repository's reports/, from any directory
from harness.results import Results, ResultsError, SweepRow, run_folder
from harness.roofline import Ceilings, measure_ceilings, throughput
from harness.timing import (
    MODES,
    GpuLockError,
    Timing,
    gpu_lock_for,
    l2_bytes_of,
    measure,
    rotation_sets,
    round_sig,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

GRIDS_DIR = Path(__file__).parent / "grids"
REPO_ROOT = Path(__file__).resolve().parent.parent
AXES = ("batch_size", "prefix_len", "num_heads", "tree_size", "tree", "layout")
DEFAULT_AXES: dict[str, list[Any]] = {"tree": ["eagle"], "layout": ["shuffled"]}
GROUP_KEYS = {"name", "impls", "modes", "timing", *AXES}
TOP_KEYS = {"description", "timing", "reference", "group"}
REFERENCE_KEYS = {"max_gflop"}


class GridError(ValueError):
    """A grid file that cannot be used; the message names the file, the group and the key."""


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 5
    min_samples: int = 20
    max_samples: int = 200
    max_time_s: float = 2.0
    rel_ci: float = 0.01


@dataclass(frozen=True)
class Group:
    name: str
    cases: tuple[CaseParams, ...]
    impls: tuple[str, ...] | None  # None: every available implementation
    modes: tuple[str, ...]
    timing: TimingPolicy


@dataclass(frozen=True)
class PlannedRun:
    impl: str
    modes: tuple[str, ...]
    timing: TimingPolicy


@dataclass(frozen=True)
class PlannedCase:
    params: CaseParams
    runs: tuple[PlannedRun, ...]


@dataclass(frozen=True)
class Grid:
    name: str
    source: str
    description: str
    groups: tuple[Group, ...]
    reference_max_gflop: float

    def plan(
        self,
        impl_names: Sequence[str],
        *,
        case_filter: str = "",
        modes: Sequence[str] = MODES,
    ) -> list[PlannedCase]:
        """Cases in grid order with, for each, the implementations (from ``impl_names``, in that
        order) and modes that time it."""
        by_case: dict[str, CaseParams] = {}
        runs: dict[str, dict[str, tuple[str, PlannedRun]]] = {}
        for group in self.groups:
            # parse_grid refuses overlapping groups already; this check keeps a grid built in
            # code from timing a case and implementation twice
            names = group.impls if group.impls is not None else impl_names
            group_modes = tuple(m for m in group.modes if m in modes)
            for case in group.cases:
                by_case.setdefault(case.case_id, case)
                seen = runs.setdefault(case.case_id, {})
                for name in names:
                    if name in seen:
                        raise GridError(
                            f"{self.source}: case {case.case_id} with {name} is in groups {seen[name][0]!r} "
                            f"and {group.name!r}; a case and implementation may appear in one group only"
                        )
                    seen[name] = (group.name, PlannedRun(name, group_modes, group.timing))
        chosen = select_cases(list(by_case), case_filter)
        order = {n: i for i, n in enumerate(impl_names)}
        out = []
        for cid in chosen:
            case_runs = sorted(
                (r for _, r in runs[cid].values() if r.modes and r.impl in order), key=lambda r: order[r.impl]
            )
            if case_runs:
                out.append(PlannedCase(by_case[cid], tuple(case_runs)))
        return out

    def check_impls(self, known: Sequence[str]) -> None:
        """Raise GridError when a group names an implementation that is not in ``known``."""
        for group in self.groups:
            unknown = sorted(set(group.impls or ()) - set(known))
            if unknown:
                raise GridError(
                    f"{self.source}, group {group.name!r}: impls has unknown implementations {unknown}; "
                    f"known: {', '.join(known)}"
                )


def registry_names() -> list[str]:
    return [i.name for i in registry.implementations()]


def select_cases(case_ids: Sequence[str], case_filter: str) -> list[str]:
    """The ids equal to ``case_filter`` if there is one, else those containing it."""
    if case_filter in case_ids:
        return [case_filter]
    return [c for c in case_ids if case_filter in c]


def timed_modes(modes: Sequence[str], device: torch.device) -> tuple[str, ...]:
    """The ``modes`` a run on ``device`` times: graph mode needs a CUDA device."""
    return tuple(m for m in modes if device.type == "cuda" or m != "graph")


def _int_list(source: str, where: str, key: str, value: Any) -> list[int]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise GridError(f"{source}, {where}: {key} must be a non-empty list of integers, got {value!r}")
    return value


def _str_list(source: str, where: str, key: str, value: Any, allowed: Sequence[str] | None) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise GridError(f"{source}, {where}: {key} must be a non-empty list of strings, got {value!r}")
    bad = [v for v in value if allowed is not None and v not in allowed]
    if bad:
        raise GridError(f"{source}, {where}: {key} has {bad}; expected values among {', '.join(allowed)}")
    twice = sorted({v for v in value if value.count(v) > 1})
    if twice:  # a mode or implementation listed twice would time each case twice, under one key
        raise GridError(
            f"{source}, {where}: {key} lists {', '.join(twice)} more than once; expected each once"
        )
    return value


def _timing(source: str, where: str, table: Any, base: TimingPolicy) -> TimingPolicy:
    if not isinstance(table, dict):
        raise GridError(f"{source}, {where}: timing must be a table, got {table!r}")
    known = {f.name for f in fields(TimingPolicy)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise GridError(f"{source}, {where}: unknown timing keys {unknown}; expected among {sorted(known)}")
    for key, value in table.items():
        kind = int if key in ("warmup", "min_samples", "max_samples") else (int, float)
        # inf or nan would pass a comparison that should fail (nan < 0 is false): a nan rel_ci
        # never stops sampling, an infinite max_time_s no longer bounds it
        if isinstance(value, bool) or not isinstance(value, kind) or not 0 <= value < math.inf:
            raise GridError(
                f"{source}, {where}: timing.{key} must be a finite non-negative number, got {value!r}"
            )
    policy = replace(base, **table)
    if not 1 <= policy.min_samples <= policy.max_samples or policy.max_time_s <= 0:
        raise GridError(
            f"{source}, {where}: timing needs 1 <= min_samples <= max_samples and max_time_s > 0, got {policy}"
        )
    return policy


def _check_overlaps(source: str, groups: Sequence[Group]) -> None:
    """Raise GridError when two groups time one case with one implementation.

    Checked here rather than only when a run is planned, so that ``--list`` and every command
    that loads the grid refuse it alike, whatever ``--impls`` narrows and whatever is available
    on the box. A group without ``impls`` times every implementation, so it overlaps every
    other group that has one of its cases.
    """
    first: dict[str, list[Group]] = {}
    for group in groups:
        for case in group.cases:
            for other in first.get(case.case_id, []):
                if other.impls is None or group.impls is None:
                    shared = sorted(set(other.impls or ()) | set(group.impls or ()))
                else:
                    shared = sorted(set(other.impls) & set(group.impls))
                    if not shared:
                        continue
                which = ", ".join(shared) if shared else "every implementation"
                raise GridError(
                    f"{source}: case {case.case_id} with {which} is in groups {other.name!r} and "
                    f"{group.name!r}; a case and implementation may appear in one group only"
                )
            first.setdefault(case.case_id, []).append(group)


def parse_grid(text: str, *, name: str, source: str) -> Grid:
    """A grid from TOML text; every error names ``source``, the group and the key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{source}: not valid TOML: {e}") from e
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise GridError(f"{source}: unknown top-level keys {unknown}; expected among {sorted(TOP_KEYS)}")
    base = _timing(source, "[timing]", doc.get("timing", {}), TimingPolicy())
    reference = doc.get("reference", {})
    if not isinstance(reference, dict):
        raise GridError(
            f"{source}: reference must be a [reference] table (max_gflop = ...), got {reference!r}"
        )
    # a misspelt cap would otherwise leave the reference timed on every case, however slow
    unknown = sorted(set(reference) - REFERENCE_KEYS)
    if unknown:
        raise GridError(
            f"{source}, [reference]: unknown keys {unknown}; expected among {sorted(REFERENCE_KEYS)}"
        )
    max_gflop = reference.get("max_gflop", math.inf)
    # inf is the default (no cap); nan would compare false with every size, a cap in name only
    if isinstance(max_gflop, bool) or not isinstance(max_gflop, (int, float)) or not max_gflop >= 0:
        raise GridError(f"{source}, [reference]: max_gflop must be a non-negative number, got {max_gflop!r}")
    raw_groups = doc.get("group")
    if not isinstance(raw_groups, list) or not raw_groups:
        raise GridError(f"{source}: expected at least one [[group]] table, got {raw_groups!r}")
    groups = []
    for i, g in enumerate(raw_groups):
        if not isinstance(g, dict):
            raise GridError(f"{source}: group #{i + 1} must be a [[group]] table, got {g!r}")
        gname = g.get("name", f"#{i + 1}")
        where = f"group {gname!r}"
        unknown = sorted(set(g) - GROUP_KEYS)
        if unknown:
            raise GridError(f"{source}, {where}: unknown keys {unknown}; expected among {sorted(GROUP_KEYS)}")
        missing = [a for a in AXES if a not in g and a not in DEFAULT_AXES]
        if missing:
            raise GridError(f"{source}, {where}: missing axes {missing}")
        axes: dict[str, list[Any]] = {}
        for axis in AXES:
            value = g.get(axis, DEFAULT_AXES.get(axis))
            if axis == "tree":
                axes[axis] = _str_list(source, where, axis, value, TREE_KINDS)
            elif axis == "layout":
                axes[axis] = _str_list(source, where, axis, value, LAYOUTS)
            else:
                axes[axis] = _int_list(source, where, axis, value)
        cases: dict[str, CaseParams] = {}
        for combo in itertools.product(*axes.values()):
            try:
                case = CaseParams(**dict(zip(AXES, combo, strict=True)))
            except ValueError as e:
                raise GridError(f"{source}, {where}: {e}") from e
            cases.setdefault(case.case_id, case)  # T1 trees of every kind are one case
        impls = g.get("impls")
        groups.append(
            Group(
                name=str(gname),
                cases=tuple(cases.values()),
                impls=None if impls is None else tuple(_str_list(source, where, "impls", impls, None)),
                modes=tuple(_str_list(source, where, "modes", g.get("modes", list(MODES)), MODES)),
                timing=_timing(source, where, g.get("timing", {}), base),
            )
        )
    _check_overlaps(source, groups)
    return Grid(
        name=name,
        source=source,
        description=str(doc.get("description", "")),
        groups=tuple(groups),
        reference_max_gflop=float(max_gflop),
    )


def load_grid(grid: str) -> Grid:
    """A grid by name (``harness/grids/<name>.toml``) or by path to a TOML file."""
    known = ", ".join(sorted(p.stem for p in GRIDS_DIR.glob("*.toml")))
    if not grid.endswith(".toml") and ("/" in grid or os.sep in grid or Path(grid).exists()):
        raise GridError(
            f"--grid {grid}: not a grid name, nor a .toml file; expected a name among {known} or a .toml path"
        )
    path = Path(grid) if grid.endswith(".toml") else GRIDS_DIR / f"{grid}.toml"
    if not path.is_file():
        raise GridError(f"--grid {grid}: no grid file {path}; expected a name among {known} or a .toml path")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(f"--grid {grid}: cannot read {path} as UTF-8 TOML text: {e}") from e
    return parse_grid(text, name=path.stem, source=str(path))


def run_dir_name(grid: str, gpu_name: str | None, sha: str | None, now: datetime) -> str:
    """``<UTC yyyymmddTHHMMSS>-sweep-<grid>-<gpu slug>-<sha7>``."""
    return run_folder(f"sweep-{grid}", gpu_name, sha, now).name


# ---------------------------------------------------------------------------------------------
# Timing a grid


@dataclass(frozen=True)
class SweepOptions:
    grid: Grid
    grid_arg: str  # as given on the command line, for repro commands
    impls: tuple[str, ...] | None  # --impls; None = all
    modes: tuple[str, ...]
    case_filter: str
    device: torch.device
    case_ids: frozenset[str] | None = None  # only these cases (a shard's); None = every case


def full_plan(opts: SweepOptions) -> list[PlannedCase]:
    """Every case of the run with the implementations named on the command line (or all
    registered, whatever is available where this runs) and the modes timed on its device."""
    names = list(opts.impls) if opts.impls is not None else registry_names()
    return opts.grid.plan(names, case_filter=opts.case_filter, modes=timed_modes(opts.modes, opts.device))


def nothing_to_time(opts: SweepOptions) -> str:
    """Why :func:`full_plan` has nothing to time, naming the option; "" when it has something."""
    plan = full_plan(opts)
    if plan and all({r.impl for r in c.runs} <= untimed_references(c, opts.grid) for c in plan):
        impls = ",".join(sorted({r.impl for c in plan for r in c.runs}))
        return (
            f"--impls {impls}: the reference is not timed above the grid's [reference] max_gflop = "
            f"{opts.grid.reference_max_gflop:g} GFLOP, and every case the run keeps is above it"
        )
    if plan:
        return ""
    grid, case_filter = opts.grid, opts.case_filter
    cases = f"the cases --case-filter {case_filter!r} keeps" if case_filter else "its cases"
    if not grid.plan(registry_names(), case_filter=case_filter):
        return f"no case of grid {grid.name} matches --case-filter {case_filter!r}"
    if opts.impls is not None and not grid.plan(list(opts.impls), case_filter=case_filter):
        return f"--impls {','.join(opts.impls)}: grid {grid.name} times none of them on {cases}"
    if not timed_modes(opts.modes, opts.device):
        return (
            f"--modes {','.join(opts.modes)}: no mode left to time on this device (--device "
            f"{opts.device.type}; graph mode needs a CUDA device)"
        )
    return (
        f"--device {opts.device.type}: no mode left to time on this device; grid {grid.name} times "
        f"{cases} in graph mode only, which needs a CUDA device"
    )


def nothing_available(opts: SweepOptions) -> str:
    """Why a run would time nothing on this box although its plan has runs: every implementation
    it would time is unavailable here (each named with its reason); "" when one is available."""
    plan = full_plan(opts)
    wanted = {r.impl for c in plan for r in c.runs if r.impl not in untimed_references(c, opts.grid)}
    reasons = []
    for impl in registry.implementations():
        if impl.name in wanted:
            ok, reason = impl.availability(opts.device)
            if ok:
                return ""
            reasons.append(f"{impl.name}: {reason}")
    return "nothing to time on this box: " + "; ".join(reasons) if reasons else ""


def out_problem(out: str | None) -> str:
    """Why the report's folder (``out``, else reports/) cannot be created and written, naming
    --out; "" when it can (:func:`harness.cli.check_out_dir`, before timing)."""
    try:
        check_run_out_dir(out, REPORTS_DIR)
    except ValueError as e:
        return str(e)
    return ""


def repro_command(opts: SweepOptions, case_id: str, impl: str, mode: str) -> str:
    return shlex.join(
        ["python", "-m", "harness", "sweep", "--grid", opts.grid_arg, "--case-filter", case_id]
        + ["--impls", impl, "--modes", mode]
        + (["--device", "cpu"] if opts.device.type == "cpu" else [])
    )


def error_row(
    opts: SweepOptions, case: CaseParams, impl: str, mode: str, nbytes: int, flops: int, why: str
) -> SweepRow:
    return SweepRow(
        case_id=case.case_id,
        impl=impl,
        params=case.to_json(),
        mode=mode,
        samples_ms=[],
        median_ms=0.0,
        iqr_ms=0.0,
        min_ms=0.0,
        max_ms=0.0,
        bytes=nbytes,
        flops=flops,
        status="error",
        note=why,
        repro=repro_command(opts, case.case_id, impl, mode),
    )


def non_finite_reason(run_fn: RunFn) -> str:
    """ "" when one call's outputs are all finite, else what is not."""
    out, lse = run_fn()
    bad = [
        name
        for name, t in (("out", out), ("lse", lse))
        if t is not None and not bool(torch.isfinite(t).all())
    ]
    return f"{' and '.join(bad)} contain NaN or Inf; not timed" if bad else ""


# What a row keeps of an NVML snapshot: what changes between cases. The board's name, UUID,
# driver and maximum clocks are in the run's environment once, not in every row.
ROW_NVML_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "throttle_reasons")


def timed_row(
    t: Timing,
    nbytes: int,
    flops: int,
    ceilings: Ceilings | None,
    nvml_state: tuple[dict[str, Any] | None, dict[str, Any] | None],
    **ids: Any,
) -> SweepRow:
    """The row of one timed (case, implementation, mode): statistics, throughput against the
    ceilings, NVML before/after and throttle flags; ``ids`` gives case_id, impl, params, mode,
    repro and any optional SweepRow fields (GPU identity, TP rank)."""
    before, after = nvml_state
    throttled, reasons = throttle_flags(before, after)
    flagged = ids.get("throttled_samples")
    if flagged:
        # The snapshots' evidence stays beside the samples': NVML may publish its violation time
        # late, so a cap during the samples can show only in the second snapshot (README,
        # "Choices made where the design was silent").
        throttled = True
        reasons = [f"capped_during_{len(flagged)}_of_{len(t.samples_ms)}_samples", *reasons]
    tp = throughput(nbytes, flops, t.median_ms, ceilings)
    return SweepRow(
        samples_ms=[round_sig(s) for s in t.samples_ms],
        median_ms=round_sig(t.stats.median_ms),
        iqr_ms=round_sig(t.stats.iqr_ms),
        min_ms=round_sig(t.stats.min_ms),
        max_ms=round_sig(t.stats.max_ms),
        bytes=nbytes,
        flops=flops,
        floor_ms=None if tp.floor_ms is None else round_sig(tp.floor_ms),
        pct_of_floor=None if tp.pct_of_floor is None else round_sig(tp.pct_of_floor),
        bandwidth_gbs=round_sig(tp.bandwidth_gbs),
        tflops=round_sig(tp.tflops),
        nvml_before=row_nvml(before),
        nvml_after=row_nvml(after),
        throttled=throttled,
        throttle_reasons=reasons,
        note=t.note,
        cold_l2=t.cold_l2,
        **ids,
    )


def row_nvml(snap: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if snap is None else {k: snap[k] for k in ROW_NVML_FIELDS}


def throttle_flags(before: dict | None, after: dict | None) -> tuple[bool, list[str]]:
    """(throttled, reasons): the reasons in either snapshot that may have lowered the clocks,
    and a power or thermal cap that held the clocks down at any time between the two (NVML's
    cumulative violation time grew: a cap during the samples that was over by the second
    snapshot, which its current reasons would miss)."""
    reasons = []
    for snap in (before, after):
        for r in snap["throttle_reasons"] if snap else []:
            if nvml.is_throttled([r]) and r not in reasons:
                reasons.append(r)
    for policy in ("power", "thermal"):
        start, end = ((snap or {}).get("violation_ns", {}).get(policy) for snap in (before, after))
        if isinstance(start, int) and isinstance(end, int) and end > start:
            reasons.append(f"{policy}_capped_{(end - start) / 1e6:.3g}ms_during_samples")
    return bool(reasons), reasons


def sample_flags(t: Timing, poller: nvml.Poller | None) -> tuple[list[int] | None, float | None]:
    """(the samples of ``t`` that ``poller``'s readings show capped (``nvml.flag_samples``), the
    SM clock line they were flagged by (``nvml.clock_line``; None: a cap alone)), or (None, None)
    where there is nothing to tell it by: no poller, no spans (the CPU), or a poller whose queries
    failed or read nothing."""
    if poller is None or t.spans is None or poller.failed or not poller.readings:
        return None, None
    flags = nvml.flag_samples(t.spans, poller.readings, max_sm_mhz=poller.max_sm_mhz)
    line = nvml.clock_line(poller.readings, poller.max_sm_mhz)
    return flags, None if line is None else round(line, 1)


def _time_impl(
    opts: SweepOptions,
    case: CaseParams,
    impl: Implementation,
    run: PlannedRun,
    batches: list,
    ceilings: Ceilings | None,
    progress: Any,
    poller: nvml.Poller | None = None,
) -> list[SweepRow]:
    nbytes, flops = batches[0].min_bytes(), batches[0].flops()
    try:
        run_fns = [impl.prepare(b) for b in batches]
        why = next((w for w in map(non_finite_reason, run_fns) if w), "")
    except Exception as e:  # an implementation that cannot run this case is a row, not a crash
        why = f"{type(e).__name__}: {e}"
    if why:
        progress.update(len(run.modes))
        return [error_row(opts, case, impl.name, m, nbytes, flops, why) for m in run.modes]
    rows = []
    for mode in run.modes:
        progress.set_postfix_str(f"{case.case_id} {impl.name} {mode}", refresh=True)
        before, _ = nvml.snapshot(opts.device)
        if poller is not None:
            poller.clear()
        try:
            t = measure(
                run_fns[0],
                mode=mode,
                rotate=run_fns[1:] or None,
                device=opts.device,
                monitor=poller,
                **asdict(run.timing),
            )
        except Exception as e:
            rows.append(error_row(opts, case, impl.name, mode, nbytes, flops, f"{type(e).__name__}: {e}"))
            progress.update(1)
            continue
        after, _ = nvml.snapshot(opts.device)
        flags, line = sample_flags(t, poller)
        rows.append(
            timed_row(
                t,
                nbytes,
                flops,
                ceilings,
                (before, after),
                case_id=case.case_id,
                impl=impl.name,
                params=case.to_json(),
                mode=mode,
                repro=repro_command(opts, case.case_id, impl.name, mode),
                impl_config=impl_config_of(run_fns[0]),
                throttled_samples=flags,
                throttle_clock_line_mhz=line,
            )
        )
        progress.update(1)
    return rows


def with_speedups(rows: list[SweepRow]) -> list[SweepRow]:
    """Each timed row with ``speedup[other] = median(other) / median(row)`` over the other timed
    implementations of the same case and mode (> 1: this row is faster)."""
    timed = [r for r in rows if r.status == "ok"]
    out = []
    for r in rows:
        if r.status != "ok":
            out.append(r)
            continue
        others = [o for o in timed if (o.case_id, o.mode) == (r.case_id, r.mode) and o.impl != r.impl]
        out.append(replace(r, speedup={o.impl: round_sig(o.median_ms / r.median_ms) for o in others}))
    return out


class _LineProgress:
    """What the sweep needs of a tqdm bar, as one stderr line per finished unit, for boxes
    without tqdm: done/total, the unit just started, and the time left at the rate so far."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done, self.what = total, desc, 0, ""
        self.start = time.monotonic()

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        print(
            f"{self.desc}: {self.done}/{self.total} done in {time.monotonic() - self.start:.0f} s",
            file=sys.stderr,
        )

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.what = text

    def update(self, n: int = 1) -> None:
        self.done += n
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        print(f"{self.desc}: {self.done}/{self.total} {self.what}, ~{left:.0f} s left", file=sys.stderr)


# Seconds between a bar's refreshes when stderr is a file (a bring-up step's log, CI's output):
# there every refresh stays in the file, and one per finished run filled ~30 KB of each sweep log.
FILE_REFRESH_S = 10.0


def progress_bar(total: int, desc: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return _LineProgress(total, desc)
    if sys.stderr.isatty():
        return tqdm(total=total, unit="run", desc=desc, dynamic_ncols=True)

    class FileBar(tqdm):
        # The case about to run shows at the next timed refresh, not in a refresh of its own.
        def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            super().set_postfix_str(s, refresh=False)

    return FileBar(total=total, unit="run", desc=desc, dynamic_ncols=True, mininterval=FILE_REFRESH_S)


def case_batches(params: CaseParams, device: torch.device, l2: int) -> tuple[list, str]:
    """(batches, "") with the case's batch and, on a GPU, the further input sets it rotates
    through for a cold L2; ([], why) when they cannot be built.

    One case that does not fit (out of memory on a big case, say) becomes error rows and the
    sweep goes on, rather than ending the run and losing every row timed before it. The
    exception, and with it what the failed build allocated, is dropped on return, so that the
    caller can give that memory back before the next case.
    """
    try:
        batches = [build_batch(params, device)]
        sets = rotation_sets(batches[0].min_bytes(), l2) if device.type == "cuda" else 0
        batches += [build_batch(params, device, input_set=k) for k in range(1, sets)]
    except Exception as e:
        return [], f"the case's inputs could not be built: {type(e).__name__}: {e}"
    return batches, ""


def reference_skip_note(name: str, cap: str, ids: Sequence[str]) -> str:
    """The run's note on the cases where the reference was not timed (a merged ``--gpus`` run
    joins its workers' notes of this form: harness/shard.py)."""
    return (
        f"{name} (the float64 reference) was not timed on {len(ids)} case(s) above {cap} GFLOP, "
        f"where it is slow: {', '.join(ids)}"
    )


def unbuilt_size(params: CaseParams) -> tuple[int, int]:
    """(bytes, FLOPs) of a case whose batch could not be built, for its error rows."""
    from harness.shard import case_bytes, case_flops  # shard imports this module

    return case_bytes(params), case_flops(params)


def run_sweep(opts: SweepOptions, command: str) -> Results:
    """Time the planned cases; returns the run's Results (not yet written)."""
    device = opts.device
    notes: list[str] = []
    if opts.grid.description:
        notes.append(f"grid {opts.grid.name}: {opts.grid.description}")
    available: list[Implementation] = []
    unavailable: list[dict[str, str]] = []
    for impl in registry.implementations():
        if opts.impls is not None and impl.name not in opts.impls:
            continue
        ok, reason = impl.availability(device)
        (available if ok else unavailable).append(impl if ok else {"impl": impl.name, "reason": reason})
    impls = {i.name: i for i in available}
    modes = timed_modes(opts.modes, device)
    if len(modes) < len(opts.modes):
        notes.append("graph mode needs a CUDA device; only cold mode was timed")
    plan = opts.grid.plan(list(impls), case_filter=opts.case_filter, modes=modes)
    plan = [c for c in plan if opts.case_ids is None or c.params.case_id in opts.case_ids]

    snap, reason = nvml.snapshot(device)
    if snap is None:
        notes.append(f"no NVML state recorded: {reason}")
    poller = nvml.Poller.of(device)[0] if snap is not None else None
    ceilings = None
    if device.type == "cuda":
        ceilings = measure_ceilings(device)
    else:
        notes.append(f"ceilings are measured on CUDA devices only; no floor on {device}")

    rows: list[SweepRow] = []
    skipped_reference: dict[str, list[str]] = {}
    l2 = l2_bytes_of(device)
    total = sum(len(r.modes) for c in plan for r in c.runs)
    with progress_bar(total, f"sweep {opts.grid.name}") as progress:
        for case in plan:
            batches, why = case_batches(case.params, device, l2)
            if why and device.type == "cuda":
                torch.cuda.empty_cache()  # what the failed build allocated goes back before the next case
            nbytes, flops = (
                (batches[0].min_bytes(), batches[0].flops()) if batches else unbuilt_size(case.params)
            )
            for run in case.runs:
                impl = impls[run.impl]
                if impl.is_reference and flops / 1e9 > opts.grid.reference_max_gflop:
                    skipped_reference.setdefault(impl.name, []).append(case.params.case_id)
                    progress.update(len(run.modes))
                    continue
                if why:
                    rows += [
                        error_row(opts, case.params, impl.name, m, nbytes, flops, why) for m in run.modes
                    ]
                    progress.update(len(run.modes))
                    continue
                rows += _time_impl(opts, case.params, impl, run, batches, ceilings, progress, poller)
            del batches
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for name, ids in skipped_reference.items():
        notes.append(reference_skip_note(name, f"{opts.grid.reference_max_gflop:g}", ids))
    return Results(
        kind="sweep",
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command,
        git=git_info(),
        environment=environment(device),  # after the runs: the kernel's build is known then
        ceilings=None if ceilings is None else ceilings.to_json(),
        sweep=with_speedups(rows),
        unavailable=unavailable,
        notes=notes,
    )


def _csv(value: str | None, allowed: Sequence[str] | None, option: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))  # each once
    bad = [v for v in items if allowed is not None and v not in allowed]
    if not items or bad:
        raise GridError(
            f"{option} {value!r}: expected a comma-separated list among {', '.join(allowed or [])}"
        )
    return items


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    try:
        grid = load_grid(args.grid)
        grid.check_impls(registry_names())
        impls = _csv(args.impls, registry_names(), "--impls")
        modes = _csv(args.modes, MODES, "--modes") or MODES
    except GridError as e:
        return _error(str(e))
    device = torch.device(args.device)
    opts = SweepOptions(grid, args.grid, impls, modes, args.case_filter, device)
    if args.gpus is not None or args.tp is not None:
        from harness import shard

        try:
            return shard.main(args, opts)
        except GpuLockError as e:
            return _error(str(e))
    if args.worker_timeout is not None:
        return _error(
            f"--worker-timeout {args.worker_timeout:g}: applies to the workers of --gpus/--tp only; "
            "this sweep starts none"
        )
    if args.shard is not None:
        from harness import shard

        try:
            opts = replace(opts, case_ids=shard.worker_case_ids(opts, args.shard))
        except shard.ShardError as e:
            return _error(str(e))
    if args.list:
        why = nothing_to_time(opts)  # as a run would say it, rather than an empty list
        if why:
            return _error(why)
        names = [n for n in registry_names() if impls is None or n in impls]
        for case in grid.plan(names, case_filter=args.case_filter, modes=timed_modes(modes, device)):
            if opts.case_ids is None or case.params.case_id in opts.case_ids:
                print(f"{case.params.case_id}: {runs_text(case, grid)}")
        return 0
    if device.type == "cuda" and not torch.cuda.is_available():
        return _error(
            "--device cuda: no CUDA device is visible to torch (use --device cpu to check plumbing)"
        )
    why = nothing_to_time(opts) or out_problem(args.out) or report_problem()
    if not why and args.shard is None:  # a worker may be dealt a share of nothing; a run is not
        why = nothing_available(opts)
    if why:
        return _error(why)
    command = shlex.join(["python", "-m", "harness", "sweep", *command_args(args)])
    if device.type == "cuda" and args.shard is not None:
        lock: contextlib.AbstractContextManager = shard.worker_lock(
            device, under_parent=shard.PARENT_ENV in os.environ
        )
    else:
        lock = gpu_lock_for(device)
    try:
        with lock:
            results = run_sweep(opts, command)
    except GpuLockError as e:
        return _error(str(e))
    return write_sweep_report(results, args.out, grid.name)


def untimed_references(case: PlannedCase, grid: Grid) -> frozenset[str]:
    """The reference implementations a run plans for ``case`` but does not time: the case is above
    the grid's ``[reference] max_gflop`` (the run's notes list them)."""
    from harness.shard import case_flops  # shard imports this module

    if case_flops(case.params) / 1e9 <= grid.reference_max_gflop:
        return frozenset()
    references = {i.name for i in registry.implementations() if i.is_reference}
    return frozenset(r.impl for r in case.runs if r.impl in references)


def runs_text(case: PlannedCase, grid: Grid | None = None) -> str:
    """``impl (mode/mode), ...``: what ``--list`` shows of a planned case; with ``grid``, a
    reference the run will not time there says so."""
    untimed = untimed_references(case, grid) if grid is not None else frozenset()
    return ", ".join(
        f"{r.impl} ({'/'.join(r.modes)})"
        + (
            f" [not timed: above [reference] max_gflop = {grid.reference_max_gflop:g}]"
            if r.impl in untimed
            else ""
        )
        for r in case.runs
    )


def report_problem() -> str | None:
    """Why the report could not be written, checked before any timing: jinja2 and matplotlib
    load only when the report is written (pandas with the command line itself), and a run that
    times for an hour must not find one missing then."""
    try:
        import jinja2  # noqa: F401
        import matplotlib.figure  # noqa: F401
        import PIL.Image  # noqa: F401
    except ImportError as e:
        return f"the report cannot be written: {e} (install the project's dependencies: pip install -e .)"
    return None


def write_sweep_report(results: Results, out: str | None, grid_label: str) -> int:
    """Write the run's report (``out`` or reports/<time>-sweep-<grid>-<gpu>-<sha7>/), list the
    error rows; exit status 1 if there are any."""
    from harness.report import write_run  # pandas and jinja2 load only when a report is written
    from harness.scaling import TITLE, fits, text_table
    from harness.targets import any_target, count_line, speedup_line, target_rows

    gpu = results.environment.get("gpu") or {}
    out_dir = (
        Path(out)
        if out
        else REPORTS_DIR
        / run_dir_name(grid_label, gpu.get("name"), results.git.get("sha"), datetime.now(timezone.utc))
    )
    try:
        write_run(results, out_dir)
    except ResultsError as e:
        print(f"error: the report could not be written: {e}", file=sys.stderr)
        return 1
    errors = [r for r in results.sweep if r.status != "ok"]
    print(f"{len(results.sweep)} rows, {len(errors)} errors -> {shown(out_dir / 'index.html')}")
    for item in results.unavailable:
        print(f"unavailable: {item['impl']}: {item['reason']}")
    found = fits(results)
    if found:
        print(f"\n{TITLE} (report --scaling):\n{text_table(found)}")
    targets = target_rows(results)
    if any_target(targets):  # last, so that a log's last lines say where the targets stand
        print(f"\ntarget cases (report --targets):\n{count_line(results, targets)}\n{speedup_line(targets)}")
    for r in errors:
        print(f"  error {r.case_id} {r.impl} {r.mode}: {r.note}", file=sys.stderr)
    return 1 if errors else 0


def worker_timeout(text: str) -> float:
    """An argparse ``type``: a positive, finite number of seconds."""
    value = positive_number("seconds")(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="time every available implementation over a grid of cases",
        description=__doc__.splitlines()[0].replace("``", ""),
    )
    p.add_argument(
        "--grid", default="default", help="quick | default | full | sm120 | PATH.toml (default: default)"
    )
    p.add_argument("--impls", help="comma-separated implementation names (default: all available)")
    p.add_argument("--modes", help="comma-separated among cold,graph (default: both)")
    p.add_argument("--case-filter", default="", help="keep cases whose id contains this (or equals it)")
    p.add_argument("--out", help="output folder (default: reports/<UTC time>-sweep-<grid>-<gpu>-<sha7>)")
    p.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cuda (default) or cpu (plumbing checks only, host clock)",
    )
    p.add_argument("--list", action="store_true", help="print the planned cases and exit")
    several = p.add_mutually_exclusive_group()
    several.add_argument(
        "--gpus",
        metavar="all|N",
        help="deal the cases to N GPUs (all: every visible one), one worker per GPU",
    )
    several.add_argument(
        "--tp", type=int, metavar="N", help="time every case tensor-parallel on N GPUs, H/N heads each"
    )
    several.add_argument("--shard", metavar="K/N", help="worker mode: time shard K (from 0) of N alone")
    p.add_argument(
        "--worker-timeout",
        type=worker_timeout,
        metavar="S",
        help="with --gpus/--tp: kill a worker still running after S seconds (default: no limit)",
    )
    p.set_defaults(func=main)


def command_args(args: argparse.Namespace) -> list[str]:
    """The options of this run as a command line (recorded in results.json; compare reads --grid)."""
    out = ["--grid", args.grid]
    for option, value in (
        ("--impls", args.impls),
        ("--modes", args.modes),
        ("--case-filter", args.case_filter),
    ):
        if value:
            out += [option, value]
    if args.device != "cuda":
        out += ["--device", args.device]
    for option, value in (("--gpus", args.gpus), ("--tp", args.tp), ("--shard", args.shard)):
        if value is not None:
            out += [option, str(value)]
    return out
