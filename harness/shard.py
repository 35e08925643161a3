"""Sweeps over every GPU of a box: sharded cases (``--gpus``) and tensor-parallel timing (``--tp``).

    python -m harness sweep --grid default --gpus all|N [--worker-timeout S]
    python -m harness sweep --grid default --tp N [--worker-timeout S]
    python -m harness sweep --grid default --shard K/N --out DIR     (one shard alone: worker mode)

Sharded sweep (``--gpus``)
    The unit of work is a case: every implementation and mode of a case runs on one GPU, so
    speedups compare like with like. The parent plans the grid as a plain sweep would (the
    ``--impls`` names, or every registered one), estimates each case's device time
    (:func:`estimated_seconds`: the case's roofline floor at nominal H200 ceilings, its timing
    policy's sample budget and a fixed cost per timed run) and deals the cases to N shards
    longest first, each to the shard with the least work so far (ties: the lower shard). The
    deal is deterministic, so a worker recomputes it from the same arguments and needs no case
    list: ``--shard K/N`` (K counts from 0, like GPU indices) times shard K alone. Shard K runs
    on the K-th GPU the parent sees, in a worker process started with ``CUDA_VISIBLE_DEVICES``
    set to that GPU alone (an entry of the parent's own ``CUDA_VISIBLE_DEVICES`` when it has
    one), writing ``results.json`` and its page into a temporary folder; its output goes to a
    log there. The parent then merges the shards into one results set in grid order: rows
    carry ``gpu_index`` (the GPU's index as the parent numbers them) and ``gpu_uuid``;
    ``environment.gpus`` lists every GPU with the ceilings its worker measured. Each worker
    measures the ceilings of its own GPU and judges its rows against them; the run's
    ``ceilings`` is the median over the GPUs, for the page's summary only.

Tensor-parallel timing (``--tp N``)
    A TPN server runs the kernel on N GPUs at once, each with H/N heads over the same KV cache,
    and a step waits for the slowest. N rank processes (one per GPU, pinned the same way) walk
    the plan in lockstep: each builds the case's batch (identical q and KV on every rank,
    seeded), keeps its own slice of the heads, and times it. Before every timed round the ranks
    meet at a barrier and after it they exchange their sample, so round i of every rank ran
    together; the number of rounds is decided from the exchanged samples, identically on every
    rank (:func:`measure_collective`: the pilot, the sample budget and the stability of the
    step times, as :func:`harness.timing.measure` decides them for one GPU). A case that one
    rank cannot run (an exception, NaN or Inf in its output) is an error row on every rank and
    never timed, so no rank waits for one that gave up. Rows: per rank
    ``<case>-tpN-rank<r>`` (``num_heads`` = H/N, its own GPU's floor), and per case the step
    row ``<case>-tpN`` (``num_heads`` = H) whose sample i is the slowest rank's sample of round
    i. A step row's bytes and FLOPs are the sum over the ranks and its GB/s and TFLOP/s are
    totals over the N GPUs; its floor is the slowest rank's floor; its note says which ranks
    were slowest how often. Every case's head count must be a multiple of N.

One timed process per GPU
    Every other run (a plain sweep, parity, A/B) holds the box's GPU lock
    (:func:`harness.timing.exclusive_gpu`). The parent of a sharded or TP run holds that lock
    for as long as its workers run, and each worker holds the lock of its own GPU, keyed by the
    GPU's UUID (:func:`gpu_lock_path`), so no two timed processes ever share a GPU, also where
    two entries of ``CUDA_VISIBLE_DEVICES`` name one board (two shards there take turns; two
    ranks of a TP run there stop the run, since they cannot run together). A worker started by
    hand holds the box's lock itself.

Failures
    A worker that exits without results, or runs past ``--worker-timeout`` (then it and its
    children are killed), fails the run: the parent names the shard or rank, its GPU, its exit
    status and the cases left untimed, prints the end of its log, keeps the temporary folder
    for a look and exits 3 without writing a report (a TP step needs every rank, so any rank's
    failure leaves every case untimed). A rank that raises breaks the barrier, so the others
    stop at once instead of waiting ``BARRIER_TIMEOUT_S``. An interrupted run (Ctrl-C) kills its
    workers, removes the temporary folder (what is there is partial) and exits 130; the ranks
    leave the interrupt to the parent and print nothing. A run with no case or mode to time, or
    whose report cannot be written, exits 2 before any worker starts.

pytest-xdist is not the tool for timed work: pytest-benchmark switches itself off under xdist
(benchmarks "cannot be performed reliably in a parallelized environment"), and a sweep is not a
test run; plain worker processes are.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from harness import nvml, registry
from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.cases import CaseParams, build_batch
from harness.env import environment, git_info
from harness.registry import Implementation, RunFn, impl_config_of
from harness.results import Results, SweepRow, load_results, write_results
from harness.roofline import Ceilings, measure_ceilings
from harness.sweep import (
    REPO_ROOT,
    PlannedCase,
    PlannedRun,
    SweepOptions,
    TimingPolicy,
    command_args,
    error_row,
    full_plan,
    load_grid,
    non_finite_reason,
    nothing_to_time,
    out_problem,
    progress_bar,
    reference_skip_note,
    report_problem,
    repro_command,
    runs_text,
    timed_modes,
    timed_row,
    with_speedups,
    write_sweep_report,
)
from harness.timing import (
    CHUNK_SAMPLES,
    FLUSH_FACTOR,
    GPU_LOCK_PATH,
    PILOT_SAMPLES,
    Sampler,
    Timing,
    capture_graph,
    exclusive_gpu,
    gpu_lock_for,
    is_stable,
    l2_bytes_of,
    rotation_sets,
    round_sig,
    sample_budget,
    spin_cycles_per_ms,
    spin_ms,
    summarize,
)

# Set in a worker's environment by the parent that holds the box's GPU lock for it.
PARENT_ENV = "VERIFY_ATTN_SHARD_PARENT"
# A priori ceilings for the cost estimate (an H200's order of magnitude) and the share of the
# floor an implementation is assumed to reach: the estimate only has to rank cases by cost.
NOMINAL_BANDWIDTH_GBS = 4000.0
NOMINAL_TFLOPS = 700.0
NOMINAL_EFFICIENCY = 0.25
# Per timed (case, implementation, mode): pilot, warm-up, graph capture, NVML, Python.
SETUP_S = 0.3
# Per sample: the L2 flush, the spin and the synchronisation around the call.
SAMPLE_OVERHEAD_S = 2e-4
# Rank processes meet between rounds within milliseconds; minutes only while one rank builds
# the kernel or autotunes a baseline that the others have cached.
BARRIER_TIMEOUT_S = 900.0
POLL_S = 0.2
HEARTBEAT_S = 60.0
LOG_TAIL_LINES = 20
EXIT_WORKER_FAILED = 3
# How a rank's error row starts when another rank failed and this one only followed it.
FOLLOWED = "not timed: rank"


class ShardError(ValueError):
    """A bad ``--gpus`` / ``--tp`` / ``--shard`` request; the message names the option."""


# ---------------------------------------------------------------------------------------------
# GPUs


@dataclass(frozen=True)
class GpuSlot:
    index: int  # the GPU's index as the parent numbers its devices; the worker's number on the CPU
    visible: str | None  # CUDA_VISIBLE_DEVICES of its worker; None on the CPU


def visible_entries(count: int, env_value: str | None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value that pins a worker to each of the parent's ``count``
    devices: the parent's own entries (indices or UUIDs) when it has any, else ``0..count-1``."""
    if env_value is None:
        return [str(i) for i in range(count)]
    entries = [e.strip() for e in env_value.split(",") if e.strip()]
    if len(entries) < count:
        raise ShardError(
            f"CUDA_VISIBLE_DEVICES={env_value!r} names {len(entries)} devices but torch sees {count}"
        )
    return entries[:count]


def resolve_gpus(
    option: str, value: str, device: torch.device, count: int, env_value: str | None
) -> list[GpuSlot]:
    """The slots of ``--gpus VALUE`` (``all`` or a number) or ``--tp VALUE`` (a number), given
    ``count`` visible CUDA devices. On the CPU a number starts that many CPU workers."""
    if device.type not in ("cuda", "cpu") or device.index is not None:
        raise ShardError(
            f"{option} {value}: --device must be 'cuda' (each worker sees only its GPU, as cuda) "
            f"or 'cpu', got {str(device)!r}"
        )
    if value == "all":
        if device.type != "cuda":
            raise ShardError(f"{option} all counts CUDA devices; with --device cpu give a number of workers")
        n = count
    else:
        try:
            n = int(value)
        except ValueError:
            raise ShardError(f"{option} {value!r}: expected 'all' or a positive number of GPUs") from None
        if n < 1:
            raise ShardError(f"{option} {value}: expected a positive number of GPUs")
    if device.type == "cpu":
        return [GpuSlot(i, None) for i in range(n)]
    if count == 0:
        raise ShardError(
            f"{option} {value}: no CUDA device is visible to torch (use --device cpu to check plumbing)"
        )
    if n > count:
        raise ShardError(
            f"{option} {value}: only {count} CUDA device(s) are visible (torch.cuda.device_count()); "
            f"ask for at most {count}"
        )
    return [GpuSlot(i, v) for i, v in enumerate(visible_entries(count, env_value)[:n])]


def gpu_lock_path(uuid: str) -> Path:
    """The lock file of one GPU, beside the box's lock (every checkout on the box shares it)."""
    safe = re.sub(r"[^A-Za-z0-9-]+", "_", uuid)
    return GPU_LOCK_PATH.with_name(f"{GPU_LOCK_PATH.stem}-{safe}{GPU_LOCK_PATH.suffix}")


def _gpu_uuid(device: torch.device) -> str | None:
    return str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else None


@contextlib.contextmanager
def worker_lock(
    device: torch.device, *, under_parent: bool, box_lock: Path = GPU_LOCK_PATH
) -> Iterator[None]:
    """The locks a worker holds while timing: its GPU's own lock, and the box's lock unless a
    parent holds it for the whole run (``under_parent``)."""
    with contextlib.ExitStack() as stack:
        if not under_parent:
            stack.enter_context(exclusive_gpu(box_lock))
        uuid = _gpu_uuid(device)
        if uuid is not None:
            stack.enter_context(exclusive_gpu(gpu_lock_path(uuid)))
        yield


# ---------------------------------------------------------------------------------------------
# Sharding plan


def case_bytes(params: CaseParams) -> int:
    """``VerifyBatch.min_bytes()`` of the case's batch, without building it."""
    tokens = params.batch_size * params.tree_size
    return params.kv_rows * QK_DIM * 2 + tokens * params.num_heads * (QK_DIM + V_DIM) * 2


def case_flops(params: CaseParams) -> int:
    """``VerifyBatch.flops()`` of the case's batch, without building it."""
    p, t, h = params.prefix_len, params.tree_size, params.num_heads
    return params.batch_size * 2 * h * t * (p + t) * (QK_DIM + V_DIM)


def estimated_seconds(case: PlannedCase, references: frozenset[str], reference_max_gflop: float) -> float:
    """A rough device time of timing ``case``: per implementation and mode, the setup, the
    warm-up and the samples its policy allows (bounded by its time budget). The reference is
    left out above its size cap, as the sweep skips it there."""
    flops = case_flops(case.params)
    call_s = (
        max(case_bytes(case.params) / (NOMINAL_BANDWIDTH_GBS * 1e9), flops / (NOMINAL_TFLOPS * 1e12))
        / NOMINAL_EFFICIENCY
    )
    total = 0.0
    for run in case.runs:
        if run.impl in references and flops / 1e9 > reference_max_gflop:
            continue
        t = run.timing
        samples = max(1, min(t.max_samples, math.floor(t.max_time_s / call_s)))
        per_mode = SETUP_S + t.warmup * call_s + samples * (call_s + SAMPLE_OVERHEAD_S)
        total += len(run.modes) * per_mode
    return total


def assign_shards(costs: Sequence[float], n: int) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``n`` shards: the costliest first, each to the shard with
    the least cost so far (ties: the earlier item, the lower shard). Each shard's indices are in
    ascending order. The most and least loaded shards differ by at most the largest cost."""
    if n < 1:
        raise ValueError(f"assign_shards: n must be >= 1, got {n}")
    loads = [0.0] * n
    shards: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        k = min(range(n), key=lambda k: (loads[k], k))
        loads[k] += costs[i]
        shards[k].append(i)
    return [sorted(s) for s in shards]


def _references() -> frozenset[str]:
    return frozenset(i.name for i in registry.implementations() if i.is_reference)


def shard_plan(opts: SweepOptions, n: int) -> list[list[PlannedCase]]:
    """``full_plan(opts)`` (the plan a sharded run deals out, whatever is available where the
    parent runs) dealt to ``n`` shards, each in grid order."""
    plan = full_plan(opts)
    refs = _references()
    costs = [estimated_seconds(c, refs, opts.grid.reference_max_gflop) for c in plan]
    return [[plan[i] for i in idx] for idx in assign_shards(costs, n)]


def parse_shard(value: str) -> tuple[int, int]:
    """``K/N`` -> (K, N) with 0 <= K < N."""
    m = re.fullmatch(r"(\d+)/(\d+)", value.strip())
    if m is None or not 0 <= int(m[1]) < int(m[2]):
        raise ShardError(f"--shard {value!r}: expected K/N with 0 <= K < N, e.g. 0/8 for the first of eight")
    return int(m[1]), int(m[2])


def worker_case_ids(opts: SweepOptions, shard: str) -> frozenset[str]:
    """The case ids of ``--shard K/N``: the parent's deal, recomputed."""
    k, n = parse_shard(shard)
    return frozenset(c.params.case_id for c in shard_plan(opts, n)[k])


# ---------------------------------------------------------------------------------------------
# Merging


@dataclass(frozen=True)
class Part:
    """One worker's results and where it ran."""

    slot: GpuSlot
    results: Results


def _stamp(row: SweepRow, part: Part) -> SweepRow:
    gpu = part.results.environment.get("gpu") or {}
    return replace(row, gpu_index=part.slot.index, gpu_uuid=gpu.get("uuid"))


def _unique(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def merged_ceilings(parts: Sequence[Part]) -> dict[str, Any] | None:
    """The median of the GPUs' ceilings, for the page's summary; rows use their own GPU's."""
    measured = [Ceilings.from_json(p.results.ceilings) for p in parts if p.results.ceilings]
    if not measured:
        return None
    first = measured[0]
    return replace(
        first,
        copy_bandwidth_gbs=statistics.median(c.copy_bandwidth_gbs for c in measured),
        bf16_tflops=statistics.median(c.bf16_tflops for c in measured),
        method=(
            f"median over {len(measured)} GPUs, each measured by its own worker (per GPU under "
            f"environment.gpus; each row's floor uses its own GPU's); per GPU: {first.method}"
        ),
        copy_median_ms=statistics.median(c.copy_median_ms for c in measured),
        matmul_median_ms=statistics.median(c.matmul_median_ms for c in measured),
        empty_kernel_ms=statistics.median(c.empty_kernel_ms for c in measured),
    ).to_json()


def merged_environment(parts: Sequence[Part]) -> dict[str, Any]:
    """The first worker's environment (one checkout, one software stack) with ``gpus``: every
    worker's GPU, its slot and its measured ceilings."""
    env = dict(parts[0].results.environment)
    env["gpus"] = [
        {
            "index": p.slot.index,
            "cuda_visible_devices": p.slot.visible,
            **(p.results.environment.get("gpu") or {}),
            "ceilings": p.results.ceilings,
        }
        for p in parts
    ]
    return env


def _merged_notes(parts: Sequence[Part], first: str) -> list[str]:
    notes = [first]
    models = _unique([(p.results.environment.get("gpu") or {}).get("name") for p in parts])
    if len(models) > 1:
        notes.append(
            f"GPUs of different models ran this run ({', '.join(map(str, models))}); compare files it "
            f"under the first"
        )
    return _unique(notes + _merged_skip_notes([n for p in parts for n in p.results.notes]))


_SKIP_NOTE = re.compile(
    r"^(?P<impl>\S+) \(the float64 reference\) was not timed on \d+ case\(s\) above "
    r"(?P<cap>\S+) GFLOP, where it is slow: (?P<ids>.+)$"
)


def _merged_skip_notes(notes: Sequence[str]) -> list[str]:
    """The workers' notes, each worker's "reference not timed on ..." note merged into one per
    implementation and cap (listing every worker's cases), the others as they are."""
    merged: dict[tuple[str, str], list[str]] = {}
    out: list[str | tuple[str, str]] = []
    for note in notes:
        m = _SKIP_NOTE.match(note)
        if m is None:
            out.append(note)
            continue
        key = (m["impl"], m["cap"])
        if key not in merged:
            merged[key] = []
            out.append(key)
        merged[key] += [i for i in m["ids"].split(", ") if i not in merged[key]]
    return [n if isinstance(n, str) else reference_skip_note(n[0], n[1], merged[n]) for n in out]


def _merged_results(
    parts: Sequence[Part], rows: list[SweepRow], note: str, created_utc: str, command: str
) -> Results:
    """One sweep Results from the workers' or ranks' parts: their rows, every GPU's environment and
    ceilings, the union of unavailable implementations, and the notes plus ``note``."""
    return Results(
        kind="sweep",
        created_utc=created_utc,
        command=command,
        git=parts[0].results.git,
        environment=merged_environment(parts),
        ceilings=merged_ceilings(parts),
        sweep=rows,
        unavailable=_unique([u for p in parts for u in p.results.unavailable]),
        notes=_merged_notes(parts, note),
    )


def merge_shards(
    parts: Sequence[Part], case_order: Sequence[str], *, command: str, created_utc: str
) -> Results:
    """One sweep from the shards' results: rows in ``case_order`` (the grid's), each stamped
    with the GPU it ran on; the environment lists every GPU."""
    if not parts:
        raise ValueError("merge_shards: expected at least one shard's results, got none")
    order = {cid: i for i, cid in enumerate(case_order)}
    rows = [_stamp(r, p) for p in parts for r in p.results.sweep]
    rows.sort(key=lambda r: order.get(r.case_id, len(order)))
    note = (
        f"sharded over {len(parts)} workers ({', '.join(_slot_text(p.slot) for p in parts)}), one process "
        "each; each case ran whole in one worker (rows: gpu_index, gpu_uuid)"
    )
    return _merged_results(parts, rows, note, created_utc, command)


def tp_case_id(case_id: str, size: int) -> str:
    return f"{case_id}-tp{size}"


def rank_case_id(case_id: str, size: int, rank: int) -> str:
    return f"{tp_case_id(case_id, size)}-rank{rank}"


def tp_step_row(rank_rows: Sequence[SweepRow]) -> SweepRow:
    """The TP step of one case, implementation and mode from its ranks' rows (rank 0 first):
    sample i is the slowest rank's sample of round i."""
    size = len(rank_rows)
    first = rank_rows[0]
    step_id = first.case_id.removesuffix("-rank0")
    where = f"TP step {step_id} {first.impl} {first.mode}"
    ranks = [r.tp_rank for r in rank_rows]
    if ranks != list(range(size)) or any(r.tp_size != size for r in rank_rows):
        raise ValueError(
            f"{where}: expected the rows of ranks 0..{size - 1} of tp_size {size}, got ranks {ranks}"
        )
    if any((r.impl, r.mode) != (first.impl, first.mode) for r in rank_rows):
        raise ValueError(f"{where}: rank rows mix implementations or modes")
    params = {**first.params, "num_heads": first.params["num_heads"] * size}
    nbytes, flops = sum(r.bytes for r in rank_rows), sum(r.flops for r in rank_rows)
    base = dict(
        case_id=step_id,
        impl=first.impl,
        params=params,
        mode=first.mode,
        bytes=nbytes,
        flops=flops,
        repro=first.repro,
        cold_l2=first.cold_l2,
        tp_size=size,
        impl_config=first.impl_config,
    )
    failed = [r for r in rank_rows if r.status != "ok"]
    if failed:
        # the ranks that failed themselves say why; the others only that they followed
        own = [r for r in failed if not r.note.startswith(FOLLOWED)] or failed
        by_note: dict[str, list[str]] = {}
        for r in own:
            by_note.setdefault(r.note, []).append(str(r.tp_rank))
        why = "; ".join(f"rank {', '.join(ranks)}: {note}" for note, ranks in by_note.items())
        return SweepRow(
            samples_ms=[], median_ms=0.0, iqr_ms=0.0, min_ms=0.0, max_ms=0.0, status="error", note=why, **base
        )
    lengths = {len(r.samples_ms) for r in rank_rows}
    if len(lengths) != 1:
        raise ValueError(
            f"{where}: ranks took {sorted(len(r.samples_ms) for r in rank_rows)} samples; "
            "rounds must pair up (one per rank)"
        )
    rounds = list(zip(*(r.samples_ms for r in rank_rows), strict=True))
    step = [max(values) for values in rounds]
    slowest = [max(range(size), key=lambda k, v=values: (v[k], -k)) for values in rounds]
    counts = sorted(((slowest.count(k), k) for k in set(slowest)), key=lambda c: (-c[0], c[1]))
    stats = summarize(step)
    floors = [r.floor_ms for r in rank_rows]
    floor = max(floors) if all(f is not None for f in floors) else None
    reasons = _unique([x for r in rank_rows for x in r.throttle_reasons])
    rank_notes = _unique([f"rank {r.tp_rank}: {r.note}" for r in rank_rows if r.note])
    note = (
        f"TP{size} step: per round the slowest of {size} ranks; slowest "
        + ", ".join(f"rank {k} in {c} of {len(step)} rounds" for c, k in counts)
        + "".join(f"; {n}" for n in rank_notes)
    )
    seconds = stats.median_ms * 1e-3
    return SweepRow(
        samples_ms=step,
        median_ms=round_sig(stats.median_ms),
        iqr_ms=round_sig(stats.iqr_ms),
        min_ms=round_sig(stats.min_ms),
        max_ms=round_sig(stats.max_ms),
        floor_ms=floor,
        pct_of_floor=None if floor is None else round_sig(100.0 * floor / stats.median_ms),
        bandwidth_gbs=round_sig(nbytes / seconds / 1e9),
        tflops=round_sig(flops / seconds / 1e12),
        throttled=any(r.throttled for r in rank_rows),
        throttle_reasons=reasons,
        note=note,
        **base,
    )


def merge_tp(parts: Sequence[Part], *, size: int, command: str, created_utc: str) -> Results:
    """One sweep from the ranks' results (rank r = ``parts[r]``): per case, implementation and
    mode the step row, then every rank's row stamped with its GPU."""
    if len(parts) != size:
        raise ValueError(f"merge_tp: expected the results of {size} ranks, got {len(parts)}")
    groups: dict[tuple[str, str, str], list[SweepRow]] = {}
    for p in parts:
        for r in p.results.sweep:
            if r.tp_rank is None:
                raise ValueError(f"merge_tp: row {r.case_id} {r.impl} {r.mode} has no tp_rank")
            step_id = r.case_id.removesuffix(f"-rank{r.tp_rank}")
            groups.setdefault((step_id, r.impl, r.mode), []).append(_stamp(r, p))
    rows: list[SweepRow] = []
    for key, group in groups.items():
        group.sort(key=lambda r: r.tp_rank)
        missing = sorted(set(range(size)) - {r.tp_rank for r in group})
        if missing:
            raise ValueError(f"merge_tp: {' '.join(key)} has no rows from ranks {missing}")
        rows += [tp_step_row(group), *group]
    ranks = ", ".join(f"rank {k} on {_slot_text(p.slot)}" for k, p in enumerate(parts))
    note = (
        f"tensor parallel over {size} GPUs ({ranks}): every rank times H/{size} heads over the same KV, "
        f"rounds started together; <case>-tp{size} rows are the step (the slowest rank per round), "
        f"<case>-tp{size}-rank<r> rows each rank's own samples"
    )
    return _merged_results(parts, with_speedups(rows), note, created_utc, command)


# ---------------------------------------------------------------------------------------------
# Collective timing (one call per rank)

Call = Callable[[], object]


class Collective:
    """What the ranks of a TP run share: a barrier and one float slot per rank.

    ``barrier`` is a ``multiprocessing`` (or ``threading``) barrier of ``size`` parties;
    ``slots`` any indexable sequence of ``size`` floats visible to every rank."""

    def __init__(self, rank: int, size: int, barrier: Any, slots: Any, timeout_s: float | None) -> None:
        self.rank, self.size, self.barrier, self.slots, self.timeout_s = rank, size, barrier, slots, timeout_s

    def wait(self) -> None:
        self.barrier.wait(self.timeout_s)

    def gather(self, value: float) -> list[float]:
        """Every rank's ``value``, in rank order. The second wait keeps a fast rank from
        overwriting its slot before the others have read it; it also starts the next round."""
        self.slots[self.rank] = float(value)
        self.wait()
        values = [float(self.slots[k]) for k in range(self.size)]
        self.wait()
        return values

    def failed_ranks(self, failed: bool) -> list[int]:
        return [k for k, v in enumerate(self.gather(1.0 if failed else 0.0)) if v]


def measure_collective(
    run_fns: Sequence[Call],
    coll: Collective,
    *,
    mode: str,
    device: torch.device,
    policy: TimingPolicy,
) -> tuple[Timing | None, str]:
    """Time this rank's call in rounds that start together on every rank.

    ``run_fns``: the call on each input set (more than one: rotated, no flush). Returns
    (Timing of this rank's samples, "") or (None, why) when any rank could not prepare the
    timing (graph capture, warm-up); then no rank timed. Every rank takes the same number of
    samples: the budget comes from the slowest rank's pilot and the stopping rule reads the
    step times (the slowest rank per round), which every rank knows."""
    why = ""
    try:
        calls = list(run_fns)
        if len(calls) > 1:
            flush_bytes, cold_l2 = 0, f"rotate {len(calls)} input sets"
        else:
            flush_bytes = int(FLUSH_FACTOR * l2_bytes_of(device))
            cold_l2 = f"flush {flush_bytes / 1e6:.0f} MB" + ("" if device.type == "cuda" else " (host cache)")
        if mode == "graph":
            calls = [capture_graph(c, device, policy.warmup) for c in calls]
        sampler = Sampler(calls, device, flush_bytes)
        host_ms = [sampler.untimed() for _ in range(max(policy.warmup, len(calls), 1))]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            index = device.index if device.index is not None else torch.cuda.current_device()
            sampler.spin_cycles = int(spin_ms(host_ms) * spin_cycles_per_ms(index))
    except Exception as e:  # this rank's failure becomes every rank's error row
        why = f"{type(e).__name__}: {e}"
    failed = coll.failed_ranks(bool(why))
    if failed:
        return (
            None,
            why or f"{FOLLOWED} {', '.join(map(str, failed))} could not prepare the {mode} timing",
        )

    own: list[float] = []
    step: list[float] = []

    def rounds(count: int) -> None:
        for _ in range(count):
            sample = sampler.samples(1)[0]
            own.append(sample)
            step.append(max(coll.gather(sample)))

    rounds(min(PILOT_SAMPLES, policy.max_samples))
    budget, note = sample_budget(
        max(statistics.median(step), 1e-6),
        min_samples=policy.min_samples,
        max_samples=policy.max_samples,
        max_time_s=policy.max_time_s,
    )
    while len(own) < budget:
        if len(own) >= policy.min_samples and is_stable(step, policy.rel_ci):
            break
        want = policy.min_samples - len(own) if len(own) < policy.min_samples else CHUNK_SAMPLES
        rounds(min(want, budget - len(own)))
    return Timing(mode=mode, samples_ms=own, stats=summarize(own), cold_l2=cold_l2, note=note), ""


# ---------------------------------------------------------------------------------------------
# A TP rank


@dataclass(frozen=True)
class TpSpec:
    """What every rank process needs to walk the same plan (picklable)."""

    grid_arg: str
    impls: tuple[str, ...] | None
    modes: tuple[str, ...]
    case_filter: str
    device_type: str  # "cuda" | "cpu"
    size: int
    command: str
    barrier_timeout_s: float = BARRIER_TIMEOUT_S


def head_slice(batch: VerifyBatch, rank: int, size: int) -> VerifyBatch:
    """Rank ``rank``'s heads of ``batch`` (H/size of them), over the same KV."""
    h = batch.num_heads // size
    return replace(batch, q=batch.q[:, rank * h : (rank + 1) * h].contiguous())


class _Quiet:
    """The progress interface for ranks other than 0 (one bar for the run is enough)."""

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def _rank_row(
    opts: SweepOptions,
    spec: TpSpec,
    rank: int,
    case: CaseParams,
    impl: str,
    mode: str,
    batch: VerifyBatch,
    timing: Timing | None,
    why: str,
    nvml_state: tuple[dict | None, dict | None],
    ceilings: Ceilings | None,
    impl_config: str = "",
) -> SweepRow:
    nbytes, flops = batch.min_bytes(), batch.flops()
    size = spec.size
    ids = dict(
        case_id=rank_case_id(case.case_id, size, rank),
        params={**case.to_json(), "num_heads": case.num_heads // size},
        repro=f"{repro_command(opts, case.case_id, impl, mode)} --tp {size}",
        tp_rank=rank,
        tp_size=size,
        impl_config=impl_config,
    )
    if timing is None:
        return replace(error_row(opts, case, impl, mode, nbytes, flops, why), **ids)
    return timed_row(timing, nbytes, flops, ceilings, nvml_state, impl=impl, mode=mode, **ids)


def _plan_digest(plan: Sequence[PlannedCase]) -> float:
    text = repr([(c.params.case_id, [(r.impl, r.modes) for r in c.runs]) for c in plan])
    return float(zlib.crc32(text.encode()))


def run_rank(spec: TpSpec, rank: int, coll: Collective) -> Results:
    """Rank ``rank``'s part of a TP sweep on this process's device (its rows only)."""
    device = torch.device(spec.device_type)
    grid = load_grid(spec.grid_arg)
    opts = SweepOptions(grid, spec.grid_arg, spec.impls, spec.modes, spec.case_filter, device)
    notes = [f"grid {grid.name}: {grid.description}"] if grid.description else []
    impls: dict[str, Implementation] = {}
    unavailable: list[dict[str, str]] = []
    for impl in registry.implementations():
        if spec.impls is None or impl.name in spec.impls:
            ok, reason = impl.availability(device)
            if ok:
                impls[impl.name] = impl
            else:
                unavailable.append({"impl": impl.name, "reason": reason})
    modes = timed_modes(spec.modes, device)
    if len(modes) < len(spec.modes):
        notes.append("graph mode needs a CUDA device; only cold mode was timed")
    plan = grid.plan(list(impls), case_filter=spec.case_filter, modes=modes)
    if len(set(coll.gather(_plan_digest(plan)))) != 1:
        raise RuntimeError(
            f"rank {rank}: the ranks planned different cases (implementations available on some GPUs "
            f"only?); this rank has {sorted(impls)}"
        )
    snap, reason = nvml.snapshot(device)
    if snap is None:
        notes.append(f"no NVML state recorded: {reason}")
    ceilings = measure_ceilings(device) if device.type == "cuda" else None
    if ceilings is None:
        notes.append(f"ceilings are measured on CUDA devices only; no floor on {device}")

    rows: list[SweepRow] = []
    skipped: list[str] = []
    l2 = l2_bytes_of(device)
    total = sum(len(r.modes) for c in plan for r in c.runs)
    progress = progress_bar(total, f"sweep {grid.name} tp{spec.size}") if rank == 0 else _Quiet()
    with progress:
        for case in plan:
            first = head_slice(build_batch(case.params, device), rank, spec.size)
            sets = rotation_sets(first.min_bytes(), l2) if device.type == "cuda" else 0
            batches = [first] + [
                head_slice(build_batch(case.params, device, input_set=k), rank, spec.size)
                for k in range(1, sets)
            ]
            for run in case.runs:
                rows += _time_rank_run(
                    opts,
                    spec,
                    rank,
                    coll,
                    case.params,
                    impls[run.impl],
                    run,
                    batches,
                    ceilings,
                    progress,
                    skipped,
                )
            del batches, first
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if skipped:
        notes.append(
            f"the reference was not timed on {len(skipped)} case(s) above {grid.reference_max_gflop:g} GFLOP "
            f"per rank, where it is slow: {', '.join(skipped)}"
        )
    return Results(
        kind="sweep",
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=spec.command,
        git=git_info(),
        environment=environment(device),  # after the runs: the kernel's build is known then
        ceilings=None if ceilings is None else ceilings.to_json(),
        sweep=rows,
        unavailable=unavailable,
        notes=notes,
    )


def _time_rank_run(
    opts: SweepOptions,
    spec: TpSpec,
    rank: int,
    coll: Collective,
    case: CaseParams,
    impl: Implementation,
    run: PlannedRun,
    batches: list[VerifyBatch],
    ceilings: Ceilings | None,
    progress: Any,
    skipped: list[str],
) -> list[SweepRow]:
    """This rank's rows of one case and implementation; every decision to skip or stop is one
    that every rank takes alike."""
    if impl.is_reference and batches[0].flops() / 1e9 > opts.grid.reference_max_gflop:
        skipped.append(f"{impl.name} {case.case_id}")
        progress.update(len(run.modes))
        return []
    why = ""
    run_fns: list[RunFn] = []
    try:
        run_fns = [impl.prepare(b) for b in batches]
        why = next((w for w in map(non_finite_reason, run_fns) if w), "")
    except Exception as e:  # one rank's failure is every rank's error row
        why = f"{type(e).__name__}: {e}"
    failed = coll.failed_ranks(bool(why))
    rows = []
    for mode in run.modes:
        progress.set_postfix_str(f"{case.case_id} {impl.name} {mode}", refresh=True)
        timing, before, after = None, None, None
        if failed:
            why = why or f"{FOLLOWED} {', '.join(map(str, failed))} could not run this case"
        else:
            before, _ = nvml.snapshot(opts.device)
            timing, why = measure_collective(run_fns, coll, mode=mode, device=opts.device, policy=run.timing)
            after, _ = nvml.snapshot(opts.device)
        config = impl_config_of(run_fns[0]) if run_fns else ""
        rows.append(
            _rank_row(
                opts,
                spec,
                rank,
                case,
                impl.name,
                mode,
                batches[0],
                timing,
                why,
                (before, after),
                ceilings,
                config,
            )
        )
        progress.update(1)
    return rows


def check_own_gpu(coll: Collective, uuid: str, visible: str | None) -> None:
    """Raise when another rank runs on the same GPU: two ranks on one board would wait for
    each other's GPU lock until the barrier times out."""
    seen = coll.gather(float(zlib.crc32(uuid.encode())))
    same = [k for k, v in enumerate(seen) if v == seen[coll.rank] and k != coll.rank]
    if same:
        raise RuntimeError(
            f"rank {coll.rank} (CUDA_VISIBLE_DEVICES={visible}) and rank {', '.join(map(str, same))} "
            f"run on the same GPU {uuid}; each rank needs a GPU of its own"
        )


def _ignore_interrupt(signum: int, frame: Any) -> None:
    return None


def _rank_main(spec: TpSpec, rank: int, visible: str | None, barrier: Any, slots: Any, out: str) -> None:
    """A rank process: pin the GPU before CUDA starts, hold its lock, time, write results."""
    # Ctrl-C reaches every process of the terminal's group, the ranks too, but it is the
    # parent's to act on: it kills the ranks and removes their files. The ranks start with
    # SIGINT blocked (:func:`run_ranks`), so one still importing is not interrupted either;
    # a handler, unlike SIG_IGN, is not inherited by the programs a rank runs (a kernel build).
    signal.signal(signal.SIGINT, _ignore_interrupt)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # A group of its own, so that the parent's kill (--worker-timeout, or its own exit) takes the
    # programs this rank started too (a kernel build's ninja and nvcc), not the rank alone.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    # tqdm's default lock is a semaphore shared between processes, which a rank killed by the
    # parent would leak (a warning at exit); rank 0 draws the only bar, so a thread lock will do
    with contextlib.suppress(ImportError):
        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
    if visible is not None:
        if torch.cuda.is_initialized():
            raise RuntimeError(
                f"rank {rank}: CUDA started before CUDA_VISIBLE_DEVICES could pin GPU {visible}"
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    coll = Collective(rank, spec.size, barrier, slots, spec.barrier_timeout_s)
    device = torch.device(spec.device_type)
    try:
        uuid = _gpu_uuid(device)
        if uuid is not None:
            check_own_gpu(coll, uuid, visible)
        with worker_lock(device, under_parent=True):
            results = run_rank(spec, rank, coll)
    except BaseException:
        barrier.abort()  # the other ranks stop at their next wait instead of timing out
        raise
    write_results(results, Path(out))


# ---------------------------------------------------------------------------------------------
# The parent: start workers, wait, merge


@dataclass(frozen=True)
class Outcome:
    """How one worker (shard K of N, or rank K of a TP run) ended."""

    label: str  # "shard 2/8" or "rank 2"
    index: int  # K
    slot: GpuSlot
    results_path: Path
    log: Path | None  # None: the worker wrote to the parent's terminal
    returncode: int | None  # None when killed at the timeout
    elapsed_s: float

    def results(self) -> Results | None:
        try:
            return load_results(self.results_path)
        except Exception:  # a missing or torn file means the worker did not finish
            return None

    def where(self) -> str:
        return f"{self.label} on {_slot_text(self.slot)}"

    def why(self) -> str:
        if self.returncode is None:
            return f"timed out after {self.elapsed_s:.0f} s and was killed"
        return f"exited with status {self.returncode} without results"


@dataclass(frozen=True)
class Failure:
    outcome: Outcome
    why: str
    untimed: tuple[str, ...]  # case ids
    rerun: str  # a command that reruns its part alone


def _slot_text(slot: GpuSlot) -> str:
    if slot.visible is None:
        return f"CPU worker {slot.index}"
    return f"GPU {slot.index} (CUDA_VISIBLE_DEVICES={slot.visible})"


def worker_command(args: argparse.Namespace, shard: int, n: int, out: Path) -> list[str]:
    """The command line of shard ``shard`` of ``n``: this sweep in worker mode."""
    plain = argparse.Namespace(**{**vars(args), "gpus": None, "tp": None, "shard": None})
    return [
        sys.executable,
        "-m",
        "harness",
        "sweep",
        *command_args(plain),
        "--shard",
        f"{shard}/{n}",
        "--out",
        str(out),
    ]


def _worker_env(slot: GpuSlot) -> dict[str, str]:
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())
    # the workers import this checkout's harness, also where it is not installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if slot.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.visible
    return env


def _log_lines(log: Path, max_bytes: int) -> list[str]:
    """The non-empty lines at the end of a worker's log; tqdm rewrites its line with carriage
    returns, so those end lines too."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in re.split(r"[\r\n]", text) if line.strip()]


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_workers(
    args: argparse.Namespace,
    slots: Sequence[GpuSlot],
    shards: Sequence[Sequence[PlannedCase]],
    tmp: Path,
    timeout_s: float | None,
) -> list[Outcome]:
    """Start one worker per non-empty shard (shard K on ``slots[K]``) and wait for all of them;
    a worker past ``timeout_s`` is killed with its children, and so is every worker when the
    parent is interrupted."""
    n = len(shards)
    procs: dict[int, tuple[subprocess.Popen, Path, Path]] = {}
    ended: dict[int, Outcome] = {}
    start = time.monotonic()
    try:
        for k, cases in enumerate(shards):
            if not cases:
                continue
            out, log = tmp / f"shard-{k}", tmp / f"shard-{k}.log"
            with open(log, "wb") as f:
                procs[k] = (
                    subprocess.Popen(
                        worker_command(args, k, n, out),
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=_worker_env(slots[k]),
                        start_new_session=True,  # its own process group: a kill takes its children
                    ),
                    out,
                    log,
                )
            print(
                f"shard {k}/{n}: {len(cases)} case(s) on {_slot_text(slots[k])}, log {log}", file=sys.stderr
            )
        heartbeat = start
        while len(ended) < len(procs):
            time.sleep(POLL_S)
            now = time.monotonic()
            for k, (proc, out, log) in procs.items():
                if k in ended:
                    continue
                code = proc.poll()
                if code is None and timeout_s is not None and now - start > timeout_s:
                    _kill_group(proc)
                elif code is None:
                    continue
                ended[k] = Outcome(
                    f"shard {k}/{n}", k, slots[k], out / "results.json", log, code, now - start
                )
                status = "timed out" if code is None else f"exit {code}"
                print(f"shard {k}/{n}: {status} after {now - start:.0f} s", file=sys.stderr)
            if now - heartbeat >= HEARTBEAT_S:
                heartbeat = now
                for k, (_, _, log) in procs.items():
                    if k not in ended:
                        last = (_log_lines(log, 4096) or [""])[-1][:160]
                        print(f"shard {k}/{n}: {last}", file=sys.stderr)
    finally:
        for k, (proc, _, _) in procs.items():
            if k not in ended:
                _kill_group(proc)
    return [ended[k] for k in sorted(ended)]


def run_ranks(spec: TpSpec, slots: Sequence[GpuSlot], tmp: Path, timeout_s: float | None) -> list[Outcome]:
    """Start the rank processes (spawned: CUDA does not survive a fork) and wait for all of
    them. When one dies the parent breaks the barrier, so the others stop too."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(spec.size)
    shared = ctx.Array("d", spec.size, lock=False)
    procs = []
    ended: dict[int, Outcome] = {}
    try:
        # a rank inherits the blocked SIGINT (an interrupt while it imports is not a traceback
        # there); this process takes an interrupt held back meanwhile once it is unblocked
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for rank, slot in enumerate(slots):
                out = tmp / f"rank-{rank}.json"
                proc = ctx.Process(
                    target=_rank_main,
                    args=(spec, rank, slot.visible, barrier, shared, str(out)),
                    name=f"tp-rank-{rank}",
                )
                proc.start()
                procs.append((proc, out))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        start = time.monotonic()
        while len(ended) < len(procs):
            time.sleep(POLL_S)
            now = time.monotonic()
            for rank, (proc, out) in enumerate(procs):
                if rank in ended:
                    continue
                killed = proc.exitcode is None and timeout_s is not None and now - start > timeout_s
                if killed:
                    _kill_rank(proc)
                elif proc.exitcode is None:
                    continue
                code = None if killed else proc.exitcode
                ended[rank] = Outcome(f"rank {rank}", rank, slots[rank], out, None, code, now - start)
                if code != 0:
                    barrier.abort()
    finally:
        for proc, _ in procs:
            if proc.exitcode is None:
                _kill_rank(proc)
    return [ended[k] for k in sorted(ended)]


def _kill_rank(proc: Any) -> None:
    """Kill a rank and the programs it started: its process group once it has made one
    (:func:`_rank_main`), else the rank alone (killed before it got that far)."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.join()


def _report_failures(failures: Sequence[Failure], tmp: Path) -> None:
    for f in failures:
        print(f"error: {f.outcome.where()} {f.why}", file=sys.stderr)
        print(f"  untimed cases ({len(f.untimed)}): {', '.join(f.untimed)}", file=sys.stderr)
        tail = _log_lines(f.outcome.log, 64 * 1024)[-LOG_TAIL_LINES:] if f.outcome.log else []
        if tail:
            print(f"  end of its log {f.outcome.log}:", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)
        print(f"  rerun: {f.rerun}", file=sys.stderr)
    print(f"no report written; the workers' files are kept in {tmp}", file=sys.stderr)


def _write(results: Results, args: argparse.Namespace, grid_label: str) -> int:
    return write_sweep_report(results, args.out, grid_label)


def _command(args: argparse.Namespace) -> str:
    return shlex.join(["python", "-m", "harness", "sweep", *command_args(args)])


def _slots(option: str, value: str, device: torch.device) -> list[GpuSlot]:
    # counting devices starts no CUDA context in this process, which never times anything
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    return resolve_gpus(option, value, device, count, os.environ.get("CUDA_VISIBLE_DEVICES"))


def _timeout(args: argparse.Namespace) -> float | None:
    value = args.worker_timeout
    if value is not None and not 0 < value < math.inf:  # nan too: it would never time out
        raise ShardError(f"--worker-timeout {value:g}: expected a positive, finite number of seconds")
    return value


def _check_can_run(opts: SweepOptions, out: str | None) -> None:
    """Raise before any worker starts when the run has nothing to time or cannot write its report
    (the messages name the option, as a plain sweep's do)."""
    why = nothing_to_time(opts) or out_problem(out) or report_problem()
    if why:
        raise ShardError(why)


@contextlib.contextmanager
def workers_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder for the workers' files (``prefix`` + a unique suffix, in the system's
    temporary folder). An interrupted run removes it: what the workers left there is partial,
    and a finished shard's results.json would look like a whole run's. The run removes it
    itself when it writes its report, and keeps it, named, when a worker failed (a result the
    run returns, not an exception)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    except BaseException:  # interrupted, or no GPU lock: nothing there is a result
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _main_sharded(args: argparse.Namespace, opts: SweepOptions) -> int:
    slots = _slots("--gpus", args.gpus, opts.device)
    timeout_s = _timeout(args)
    n = len(slots)
    shards = shard_plan(opts, n)
    if args.list:
        refs = _references()
        for k, cases in enumerate(shards):
            cost = sum(estimated_seconds(c, refs, opts.grid.reference_max_gflop) for c in cases)
            print(f"shard {k}/{n} on {_slot_text(slots[k])}: {len(cases)} case(s), ~{cost:.0f} s estimated")
            for c in cases:
                print(f"  {c.params.case_id}: {runs_text(c, opts.grid)}")
        return 0
    _check_can_run(opts, args.out)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with workers_folder("verify-attention-shards-") as tmp:
        with gpu_lock_for(opts.device):
            outcomes = run_workers(args, slots, shards, tmp, timeout_s)
        parts: list[Part] = []
        failures: list[Failure] = []
        for o in outcomes:
            expected = tuple(c.params.case_id for c in shards[o.index])
            results = o.results()
            stray = sorted({r.case_id for r in results.sweep} - set(expected)) if results else []
            if results is not None and not stray:
                parts.append(Part(o.slot, results))
                continue
            why = f"timed cases outside its shard: {', '.join(stray)}" if stray else o.why()
            pin = f"CUDA_VISIBLE_DEVICES={o.slot.visible} " if o.slot.visible is not None else ""
            rerun = pin + shlex.join(worker_command(args, o.index, n, tmp / f"rerun-{o.index}"))
            failures.append(Failure(o, why, expected, rerun))
        if failures:
            _report_failures(failures, tmp)
            return EXIT_WORKER_FAILED
        order = [c.params.case_id for c in full_plan(opts)]
        merged = merge_shards(parts, order, command=_command(args), created_utc=created)
        code = _write_unless_empty(merged, args, f"{opts.grid.name}-{n}gpus")
    shutil.rmtree(tmp, ignore_errors=True)
    return code


def _main_tp(args: argparse.Namespace, opts: SweepOptions) -> int:
    n = args.tp
    slots = _slots("--tp", str(n), opts.device)
    timeout_s = _timeout(args)
    plan = full_plan(opts)
    bad = [c.params for c in plan if c.params.num_heads % n]
    if bad:
        raise ShardError(
            f"--tp {n}: every rank takes H/{n} heads, so every case's head count must be a multiple of "
            f"{n}; " + ", ".join(f"case {p.case_id} has {p.num_heads}" for p in bad)
        )
    if args.list:
        for c in plan:
            print(
                f"{tp_case_id(c.params.case_id, n)} ({c.params.num_heads // n} heads per rank): {runs_text(c)}"
            )
        return 0
    _check_can_run(opts, args.out)
    spec = TpSpec(
        grid_arg=opts.grid_arg,
        impls=opts.impls,
        modes=opts.modes,
        case_filter=opts.case_filter,
        device_type=opts.device.type,
        size=n,
        command=_command(args),
    )
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with workers_folder("verify-attention-tp-") as tmp:
        with gpu_lock_for(opts.device):
            outcomes = run_ranks(spec, slots, tmp, timeout_s)
        loaded = [(o, o.results()) for o in outcomes]
        if any(r is None for _, r in loaded):
            # a TP step needs every rank: one missing rank leaves every case untimed
            every = tuple(tp_case_id(c.params.case_id, n) for c in plan)
            _report_failures([Failure(o, o.why(), every, spec.command) for o, r in loaded if r is None], tmp)
            return EXIT_WORKER_FAILED
        parts = [Part(o.slot, r) for o, r in loaded if r is not None]
        merged = merge_tp(parts, size=n, command=spec.command, created_utc=created)
        code = _write_unless_empty(merged, args, f"{opts.grid.name}-tp{n}")
    shutil.rmtree(tmp, ignore_errors=True)
    return code


def _write_unless_empty(merged: Results, args: argparse.Namespace, label: str) -> int:
    """The merged run's report, or exit 2 without one when no worker timed anything: every
    implementation selected was unavailable there (a plain sweep refuses such a run before it
    starts; the parent leaves the check to the workers, so that it starts no CUDA context of its
    own on a GPU they time)."""
    if not merged.sweep:
        why = (
            "; ".join(sorted({f"{u['impl']}: {u['reason']}" for u in merged.unavailable})) or "none was timed"
        )
        print(
            f"error: nothing to time on this box: no implementation selected is available ({why})",
            file=sys.stderr,
        )
        return 2
    return _write(merged, args, label)


def main(args: argparse.Namespace, opts: SweepOptions) -> int:
    """``sweep --gpus`` or ``sweep --tp``: 0 when every row was timed, 1 when a row is an
    error or the report could not be written, 2 on a bad request, 3 when a worker failed (no
    report then)."""
    try:
        return _main_tp(args, opts) if args.tp is not None else _main_sharded(args, opts)
    except ShardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
