"""Sweeps over several GPUs, checked on the CPU: the deal of cases to shards, worker mode,
merging, failed and late workers, GPU selection, the per-GPU lock, and tensor-parallel timing
(the step row from per-rank samples, rounds that pair up across ranks, and a whole ``--tp``
run of two CPU ranks).

The end-to-end runs start real worker processes, which import the real registry: they time the
float64 oracle (``--impls oracle``), the one implementation that runs on the CPU. The ``gpu``
tests run the same paths on one GPU with the kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness import registry, shard, timing
from harness.batch import VerifyBatch
from harness.cases import CaseParams, build_batch
from harness.cli import main as cli_main
from harness.registry import Implementation
from harness.results import Results, SweepRow, load_results
from harness.roofline import Ceilings, floor_ms
from harness.sweep import MODES, REPO_ROOT, SweepOptions, TimingPolicy, parse_grid
from harness.timing import round_sig

GRID = """
description = "plumbing"
[timing]
warmup = 1
min_samples = 5
max_samples = 8
max_time_s = 0.5
rel_ci = 0.05
[reference]
max_gflop = 1.0
[[group]]
name = "all"
batch_size = [1]
prefix_len = [64, 256]
num_heads = [8]
tree_size = [1, 4]
"""
CASES = ["B1-P64-T1-H8-shuffled", "B1-P64-T4-H8-shuffled", "B1-P256-T1-H8-shuffled", "B1-P256-T4-H8-shuffled"]


@pytest.fixture()
def grid_file(tmp_path: Path) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    return path


@pytest.fixture()
def run_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a run's temporary folders go: inside the test's own, so none outlives the test."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _opts(impls: tuple[str, ...] | None = ("oracle",)) -> SweepOptions:
    grid = parse_grid(GRID, name="grid", source="grid.toml")
    return SweepOptions(grid, "grid.toml", impls, MODES, "", torch.device("cpu"))


def _try_lock(path: Path) -> bool:
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


# ---------------------------------------------------------------------------------------------
# The deal


def test_every_case_lands_in_exactly_one_shard_and_loads_differ_by_at_most_the_largest_cost() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 8):
        costs = [rng.expovariate(1.0) for _ in range(37)]
        shards = shard.assign_shards(costs, n)
        assert sorted(i for s in shards for i in s) == list(range(37))
        loads = [sum(costs[i] for i in s) for s in shards]
        assert max(loads) - min(loads) <= max(costs)


def test_the_deal_is_deterministic_and_breaks_ties_by_case_then_shard_order() -> None:
    assert shard.assign_shards([1.0, 1.0, 1.0, 1.0], 2) == [[0, 2], [1, 3]]
    assert shard.assign_shards([1.0, 5.0, 1.0, 1.0, 2.0], 2) == [[1], [0, 2, 3, 4]]
    costs = [random.Random(3).random() for _ in range(20)]
    assert shard.assign_shards(costs, 4) == shard.assign_shards(list(costs), 4)


def test_more_shards_than_cases_leaves_the_extra_shards_empty() -> None:
    assert shard.assign_shards([2.0, 1.0], 4) == [[0], [1], [], []]


@pytest.mark.parametrize(
    "params",
    [CaseParams(1, 300, 8, 4), CaseParams(3, 100, 16, 16, tree="random"), CaseParams(2, 0, 8, 1)],
    ids=lambda p: p.case_id,
)
def test_case_bytes_and_flops_equal_those_of_the_built_batch(params: CaseParams) -> None:
    batch = build_batch(params, "cpu")
    assert shard.case_bytes(params) == batch.min_bytes()
    assert shard.case_flops(params) == batch.flops()


def test_bytes_and_flops_are_design_md_s_numbers_for_one_case_worked_by_hand() -> None:
    """Both sides of the test above could drift together: pinned to DESIGN.md section 5 here.
    B=1, P=1000, T=16, H=8: FLOPs = 2 * H * T * (P + T) * (576 + 512) = 2 * 8 * 16 * 1016 * 1088;
    bytes = KV rows once (1016 x 576 x 2) + q (16 x 8 x 576 x 2) + out (16 x 8 x 512 x 2)."""
    params = CaseParams(1, 1000, 8, 16)
    batch = build_batch(params, "cpu")
    assert shard.case_flops(params) == batch.flops() == 282_984_448
    assert shard.case_bytes(params) == batch.min_bytes() == 1_170_432 + 147_456 + 131_072 == 1_448_960


def test_kv_bytes_count_the_rows_the_indptrs_address_each_slot_once() -> None:
    """An over-allocated kv_indices (as the SGLang adapter may pass) is not read past
    kv_indptr[-1], and a slot two requests share is one row of the pool: DESIGN's "KV rows read
    once"."""
    from dataclasses import replace

    batch = build_batch(CaseParams(2, 100, 8, 4), "cpu")
    rows = 2 * (100 + 4)
    assert batch.kv_bytes() == rows * 576 * 2
    padded = replace(batch, kv_indices=torch.cat([batch.kv_indices, batch.kv_indices[:50]]))
    assert padded.kv_bytes() == rows * 576 * 2
    shared = batch.kv_indices.clone()
    shared[104:114] = shared[:10]  # request 1's first ten prefix slots are request 0's
    assert replace(batch, kv_indices=shared).kv_bytes() == (rows - 10) * 576 * 2


def test_cost_grows_with_the_prefix_and_leaves_out_the_reference_above_its_cap() -> None:
    plan = {c.params.case_id: c for c in _opts(("kernel", "ref")).grid.plan(["kernel", "ref"])}
    short, long = plan["B1-P64-T4-H8-shuffled"], plan["B1-P256-T4-H8-shuffled"]
    refs = frozenset({"ref"})
    assert shard.estimated_seconds(long, refs, 1.0) > shard.estimated_seconds(short, refs, 1.0)
    # capped below this case's size the reference is not timed there: one run fewer
    with_ref = shard.estimated_seconds(long, refs, 1.0)
    assert shard.estimated_seconds(long, refs, 1e-9) == pytest.approx(with_ref / 2)


def test_shard_plan_covers_the_grid_and_keeps_grid_order_within_each_shard() -> None:
    opts = _opts()
    shards = shard.shard_plan(opts, 3)
    ids = [[c.params.case_id for c in s] for s in shards]
    assert sorted(i for s in ids for i in s) == sorted(CASES)
    assert all(s == sorted(s, key=CASES.index) for s in ids)


@pytest.mark.parametrize("value", ["2/2", "a/b", "-1/3", "1"])
def test_a_bad_shard_is_an_error_naming_the_option(value: str) -> None:
    with pytest.raises(shard.ShardError, match=r"--shard .*expected K/N with 0 <= K < N"):
        shard.parse_shard(value)


# ---------------------------------------------------------------------------------------------
# GPU selection and locks


def test_gpus_all_takes_every_visible_device_pinned_by_the_parents_own_entries() -> None:
    cuda = torch.device("cuda")
    assert shard.resolve_gpus("--gpus", "all", cuda, 3, None) == [
        shard.GpuSlot(0, "0"),
        shard.GpuSlot(1, "1"),
        shard.GpuSlot(2, "2"),
    ]
    assert shard.resolve_gpus("--gpus", "2", cuda, 3, "5, 2,GPU-abc") == [
        shard.GpuSlot(0, "5"),
        shard.GpuSlot(1, "2"),
    ]
    assert shard.resolve_gpus("--gpus", "2", torch.device("cpu"), 0, None) == [
        shard.GpuSlot(0, None),
        shard.GpuSlot(1, None),
    ]


@pytest.mark.parametrize(
    ("value", "device", "count", "message"),
    [
        ("3", "cuda", 2, r"--gpus 3: only 2 CUDA device\(s\) are visible \(torch.cuda.device_count\(\)\)"),
        ("1", "cuda", 0, r"--gpus 1: no CUDA device is visible to torch"),
        ("all", "cpu", 0, r"--gpus all counts CUDA devices; with --device cpu give a number"),
        ("0", "cuda", 2, r"--gpus 0: expected a positive number"),
        ("two", "cuda", 2, r"--gpus 'two': expected 'all' or a positive number"),
        ("2", "cuda:1", 2, r"--gpus 2: --device must be 'cuda' .* got 'cuda:1'"),
    ],
)
def test_a_bad_gpu_request_is_an_error_naming_the_option(value, device, count, message) -> None:
    with pytest.raises(shard.ShardError, match=message):
        shard.resolve_gpus("--gpus", value, torch.device(device), count, None)


def test_sweep_asking_for_more_gpus_than_the_box_has_exits_2_naming_gpus(
    grid_file: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cli_main(["sweep", "--grid", str(grid_file), "--gpus", "3"]) == 2
    assert "error: --gpus 3: only 2 CUDA device(s) are visible" in capsys.readouterr().err


def test_sweep_with_tp_not_dividing_the_heads_exits_2_naming_tp_and_the_case(grid_file: Path, capsys) -> None:
    assert cli_main(["sweep", "--grid", str(grid_file), "--device", "cpu", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "error: --tp 3: every rank takes H/3 heads" in err
    assert "case B1-P64-T4-H8-shuffled has 8" in err


@pytest.fixture()
def no_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that gets as far as starting workers or ranks fails the test."""

    def start(*args, **kwargs):
        raise AssertionError("workers were started")

    monkeypatch.setattr(shard, "run_workers", start)
    monkeypatch.setattr(shard, "run_ranks", start)


@pytest.mark.parametrize("several", [["--gpus", "2"], ["--tp", "2"]], ids=["gpus", "tp"])
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--case-filter", "nomatch"], "error: no case of grid grid matches --case-filter 'nomatch'"),
        (["--modes", "graph"], "error: --modes graph: no mode left to time on this device (--device cpu;"),
    ],
    ids=["no-case", "graph-mode-on-the-cpu"],
)
def test_a_run_with_nothing_to_time_exits_2_before_starting_workers(
    grid_file: Path,
    tmp_path: Path,
    no_workers: None,
    capsys,
    several: list[str],
    extra: list[str],
    message: str,
) -> None:
    assert cli_main(_args(grid_file, tmp_path / "run", *several, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("several", [["--gpus", "2"], ["--tp", "2"]], ids=["gpus", "tp"])
def test_a_run_whose_out_is_a_file_exits_2_naming_out_before_starting_workers(
    grid_file: Path, tmp_path: Path, no_workers: None, capsys, several: list[str]
) -> None:
    out = tmp_path / "taken"
    out.write_text("keep me")
    assert cli_main(_args(grid_file, out, *several)) == 2
    assert f"error: --out {out} is a file; expected a folder" in capsys.readouterr().err
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -5.0])
def test_a_worker_timeout_that_is_not_a_positive_finite_number_is_an_error(value: float) -> None:
    with pytest.raises(
        shard.ShardError, match="--worker-timeout .*: expected a positive, finite number of seconds"
    ):
        shard._timeout(argparse.Namespace(worker_timeout=value))


@pytest.mark.parametrize(
    ("several", "first"),
    [(["--gpus", "2"], "shard 0/2 on CPU worker 0"), (["--tp", "2"], "B1-P64-T1-H8-shuffled-tp2")],
    ids=["gpus", "tp"],
)
def test_listing_a_cpu_run_shows_only_the_modes_the_cpu_times(
    grid_file: Path, capsys, several: list[str], first: str
) -> None:
    assert (
        cli_main(
            ["sweep", "--grid", str(grid_file), "--device", "cpu", "--impls", "oracle", "--list", *several]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(first) and "oracle (cold)" in out and "graph" not in out


def test_each_gpu_has_its_own_lock_beside_the_boxs() -> None:
    a, b = shard.gpu_lock_path("GPU-1234-ab"), shard.gpu_lock_path("GPU-5678/x")
    assert a != b and a.parent == b.parent == shard.GPU_LOCK_PATH.parent
    assert a == shard.gpu_lock_path("GPU-1234-ab") and "/" not in b.name


def test_a_worker_holds_its_gpus_lock_and_the_boxs_only_without_a_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard, "GPU_LOCK_PATH", tmp_path / "gpu.lock")
    monkeypatch.setattr(shard, "_gpu_uuid", lambda device: "GPU-test")
    box, own = tmp_path / "box.lock", shard.gpu_lock_path("GPU-test")
    cpu = torch.device("cpu")
    with shard.worker_lock(cpu, under_parent=True, box_lock=box):
        assert not _try_lock(own) and _try_lock(box)
    with shard.worker_lock(cpu, under_parent=False, box_lock=box):
        assert not _try_lock(own) and not _try_lock(box)
    assert _try_lock(own) and _try_lock(box)


# ---------------------------------------------------------------------------------------------
# Merging


# A case's params, as every results file's sweep rows carry them (SWEEP_PARAMS_REQUIRED).
PARAMS = CaseParams(batch_size=1, prefix_len=64, num_heads=8, tree_size=1, tree="eagle").to_json()


def _row(case_id: str, impl: str = "a", median: float = 1.0, **kw) -> SweepRow:
    samples = kw.pop("samples", [median])
    params = {**PARAMS, **kw.pop("params", {})}
    return SweepRow(case_id, impl, params, "cold", samples, median, 0.0, median, median, 10, 20, **kw)


def _results(rows: list[SweepRow], gpu: dict | None, ceilings: dict | None = None, **kw) -> Results:
    return Results(
        kind="sweep",
        created_utc="2026-01-01T00:00:00+00:00",
        command="python -m harness sweep --shard 0/2",
        git={"sha": "abc"},
        environment={"gpu": gpu, "torch": "x"},
        ceilings=ceilings,
        sweep=rows,
        **kw,
    )


def _ceilings(bandwidth: float, tflops: float) -> dict:
    return Ceilings(bandwidth, tflops, "copy and matmul", 1, 1, 1.0, 1.0).to_json()


def test_merging_shards_keeps_every_row_with_its_gpu_in_grid_order() -> None:
    h200 = {"name": "NVIDIA H200", "uuid": "GPU-aaa"}
    parts = [
        shard.Part(
            shard.GpuSlot(0, "0"),
            _results(
                [_row(CASES[3]), _row(CASES[0]), _row(CASES[0], "b")],
                h200,
                _ceilings(4000, 700),
                unavailable=[{"impl": "sg", "reason": "no sglang"}],
                notes=["grid g: plumbing"],
            ),
        ),
        shard.Part(
            shard.GpuSlot(1, "3"),
            _results(
                [_row(CASES[1])],
                {**h200, "uuid": "GPU-bbb"},
                _ceilings(3000, 900),
                unavailable=[{"impl": "sg", "reason": "no sglang"}],
                notes=["grid g: plumbing"],
            ),
        ),
    ]
    merged = shard.merge_shards(parts, CASES, command="python -m harness sweep --gpus 2", created_utc="t")
    assert [(r.case_id, r.impl, r.gpu_index, r.gpu_uuid) for r in merged.sweep] == [
        (CASES[0], "a", 0, "GPU-aaa"),
        (CASES[0], "b", 0, "GPU-aaa"),
        (CASES[1], "a", 1, "GPU-bbb"),
        (CASES[3], "a", 0, "GPU-aaa"),
    ]
    gpus = merged.environment["gpus"]
    assert [(g["index"], g["cuda_visible_devices"], g["uuid"]) for g in gpus] == [
        (0, "0", "GPU-aaa"),
        (1, "3", "GPU-bbb"),
    ]
    assert gpus[1]["ceilings"]["copy_bandwidth_gbs"] == 3000
    assert merged.environment["gpu"]["uuid"] == "GPU-aaa"  # the run's model, for compare and the title
    assert (merged.ceilings["copy_bandwidth_gbs"], merged.ceilings["bf16_tflops"]) == (3500, 800)
    assert merged.unavailable == [{"impl": "sg", "reason": "no sglang"}]
    assert merged.notes[1:] == ["grid g: plumbing"] and "sharded over 2 workers" in merged.notes[0]
    assert merged.command == "python -m harness sweep --gpus 2"


def test_results_written_before_the_gpu_and_tp_fields_still_load(tmp_path: Path) -> None:
    row = _row(CASES[0])
    doc = Results.to_json(_results([row], None))
    for key in ("gpu_index", "gpu_uuid", "tp_rank", "tp_size"):
        del doc["sweep"][0][key]
    loaded = Results.from_json(doc)
    assert loaded.sweep[0] == row and loaded.sweep[0].gpu_index is None and loaded.sweep[0].tp_size is None


def _rank_rows(samples: list[list[float]], impl: str = "a", **kw) -> list[SweepRow]:
    size = len(samples)
    return [
        _row(
            shard.rank_case_id(CASES[0], size, k),
            impl,
            samples=s,
            params={"num_heads": 4, "prefix_len": 64},
            tp_rank=k,
            tp_size=size,
            floor_ms=kw.get("floors", [None] * size)[k],
            throttled=k == kw.get("throttled_rank"),
            throttle_reasons=["sw_power_cap"] if k == kw.get("throttled_rank") else [],
        )
        for k, s in enumerate(samples)
    ]


def test_the_tp_step_takes_the_slowest_rank_of_every_round() -> None:
    rows = _rank_rows([[1.0, 5.0, 2.0, 1.0], [3.0, 1.0, 2.0, 4.0]], floors=[0.5, 0.8], throttled_rank=1)
    step = shard.tp_step_row(rows)
    assert step.case_id == f"{CASES[0]}-tp2" and step.tp_size == 2 and step.tp_rank is None
    assert step.samples_ms == [3.0, 5.0, 2.0, 4.0]
    assert (step.median_ms, step.min_ms, step.max_ms) == (3.5, 2.0, 5.0)
    assert step.params["num_heads"] == 8 and (step.bytes, step.flops) == (20, 40)
    assert step.floor_ms == 0.8 and step.pct_of_floor == round_sig(100 * 0.8 / 3.5)
    assert step.throttled and step.throttle_reasons == ["sw_power_cap"]
    # round 3 is a tie: the lower rank counts as the slowest
    assert "slowest rank 0 in 2 of 4 rounds, rank 1 in 2 of 4 rounds" in step.note


def test_the_tp_step_is_an_error_naming_the_rank_that_failed() -> None:
    rows = _rank_rows([[1.0], [1.0], [1.0]])
    rows[1] = replace(rows[1], status="error", samples_ms=[], note="RuntimeError: out of memory")
    for k in (0, 2):
        rows[k] = replace(
            rows[k], status="error", samples_ms=[], note=f"{shard.FOLLOWED} 1 could not run this case"
        )
    step = shard.tp_step_row(rows)
    assert step.status == "error" and step.samples_ms == []
    assert step.note == "rank 1: RuntimeError: out of memory"


def test_tp_rounds_that_do_not_pair_up_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"ranks took \[2, 3\] samples; rounds must pair up"):
        shard.tp_step_row(_rank_rows([[1.0, 2.0, 3.0], [1.0, 2.0]]))


def test_merging_tp_ranks_gives_the_step_then_every_rank_with_speedups_between_steps() -> None:
    a = _rank_rows([[2.0, 2.0], [4.0, 4.0]])
    b = _rank_rows([[1.0, 1.0], [1.0, 2.0]], "b")
    parts = [
        shard.Part(
            shard.GpuSlot(k, str(k)), _results([a[k], b[k]], {"name": "NVIDIA H200", "uuid": f"GPU-{k}"})
        )
        for k in range(2)
    ]
    merged = shard.merge_tp(parts, size=2, command="c", created_utc="t")
    step_id = f"{CASES[0]}-tp2"
    assert [(r.case_id, r.impl, r.tp_rank, r.gpu_index) for r in merged.sweep] == [
        (step_id, "a", None, None),
        (f"{step_id}-rank0", "a", 0, 0),
        (f"{step_id}-rank1", "a", 1, 1),
        (step_id, "b", None, None),
        (f"{step_id}-rank0", "b", 0, 0),
        (f"{step_id}-rank1", "b", 1, 1),
    ]
    step_a, step_b = merged.sweep[0], merged.sweep[3]
    assert step_a.samples_ms == [4.0, 4.0] and step_b.samples_ms == [1.0, 2.0]
    assert step_b.speedup == {"a": round_sig(4.0 / 1.5)}
    assert [g["uuid"] for g in merged.environment["gpus"]] == ["GPU-0", "GPU-1"]


# ---------------------------------------------------------------------------------------------
# Collective timing: ranks as threads


def _as_ranks(size: int, body) -> list:
    """``body(coll)`` on ``size`` threads standing in for rank processes; each rank's return
    value, or the exception it raised."""
    barrier, slots, out = threading.Barrier(size), [0.0] * size, [None] * size

    def rank(k: int) -> None:
        try:
            out[k] = body(shard.Collective(k, size, barrier, slots, timeout_s=30))
        except Exception as e:
            out[k] = e

    threads = [threading.Thread(target=rank, args=(k,)) for k in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is stuck at the barrier"
    return out


def _collective_run(calls: list, policy: TimingPolicy) -> list:
    cpu = torch.device("cpu")
    return _as_ranks(
        len(calls),
        lambda coll: shard.measure_collective(
            [calls[coll.rank]], coll, mode="cold", device=cpu, policy=policy
        ),
    )


def test_every_rank_takes_the_same_rounds_and_the_slow_rank_sets_the_budget() -> None:
    policy = TimingPolicy(warmup=1, min_samples=4, max_samples=30, max_time_s=0.1, rel_ci=1e-9)
    # alone, rank 0 (~1 ms a call) would take all 30 samples (rel_ci is never met); rank 1
    # (~20 ms a call) fits about five in 0.1 s, and every rank follows the slowest
    (fast, _), (slow, _) = _collective_run([lambda: time.sleep(0.001), lambda: time.sleep(0.02)], policy)
    assert len(fast.samples_ms) == len(slow.samples_ms)
    assert 3 <= len(fast.samples_ms) <= 5
    assert max(fast.samples_ms) < min(slow.samples_ms)


def test_a_rank_that_cannot_prepare_stops_every_rank_without_timing() -> None:
    def broken() -> None:
        raise RuntimeError("capture failed")

    policy = TimingPolicy(warmup=1, min_samples=3, max_samples=5, max_time_s=1.0)
    (t0, why0), (t1, why1) = _collective_run([lambda: None, broken], policy)
    assert t0 is None and t1 is None
    assert why1 == "RuntimeError: capture failed"
    assert why0 == f"{shard.FOLLOWED} 1 could not prepare the cold timing"


def test_tp_ranks_on_one_gpu_are_an_error_naming_both() -> None:
    uuids = ["GPU-a", "GPU-b", "GPU-a"]
    errors = _as_ranks(3, lambda coll: shard.check_own_gpu(coll, uuids[coll.rank], str(coll.rank)))
    assert str(errors[0]) == (
        "rank 0 (CUDA_VISIBLE_DEVICES=0) and rank 2 run on the same GPU GPU-a; each rank needs a GPU of its own"
    )
    assert errors[1] is None and str(errors[2]).startswith(
        "rank 2 (CUDA_VISIBLE_DEVICES=2) and rank 0 run on"
    )


# ---------------------------------------------------------------------------------------------
# Worker mode and whole runs


def _stand_in(name: str) -> Implementation:
    def prepare(batch: VerifyBatch):
        q = batch.q[:, :, :512].float()
        return lambda: (q * 2, None)

    return Implementation(name, "test stand-in", lambda device: (True, ""), prepare, device_kind="any")


def test_worker_mode_times_only_the_cases_of_its_shard(
    grid_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "implementations", lambda: [_stand_in("a")])
    expected = [c.params.case_id for c in shard.shard_plan(_opts(None), 2)[1]]
    assert 0 < len(expected) < len(CASES)
    args = [
        "sweep",
        "--grid",
        str(grid_file),
        "--device",
        "cpu",
        "--shard",
        "1/2",
        "--out",
        str(tmp_path / "w"),
    ]
    assert cli_main(args) == 0
    results = load_results(tmp_path / "w")
    assert [r.case_id for r in results.sweep] == expected
    assert results.command.endswith("--shard 1/2")


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real ``--gpus 2 --device cpu`` run: two worker processes timing the oracle."""
    tmp = tmp_path_factory.mktemp("sharded")
    grid = tmp / "grid.toml"
    grid.write_text(GRID)
    out = tmp / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(tmp))
        code, err = _stderr_of(mp, lambda: cli_main(_args(grid, out, "--gpus", "2")))
    return {"code": code, "err": err, "out": out}


def _args(grid: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "--grid", str(grid), "--device", "cpu", "--impls", "oracle", "--out", str(out), *extra]


def _stderr_of(mp: pytest.MonkeyPatch, run) -> tuple[int, str]:
    buf = io.StringIO()
    mp.setattr(sys, "stderr", buf)
    code = run()
    return code, buf.getvalue()


def test_a_sharded_cpu_run_merges_both_workers_into_one_report(sharded_run: dict) -> None:
    assert sharded_run["code"] == 0, sharded_run["err"]
    out = sharded_run["out"]
    assert (out / "results.json").is_file() and (out / "index.html").is_file()
    results = load_results(out)
    assert [r.case_id for r in results.sweep] == CASES  # every case once, in grid order
    deal = shard.shard_plan(_opts(), 2)
    where = {c.params.case_id: k for k, cases in enumerate(deal) for c in cases}
    assert {r.case_id: r.gpu_index for r in results.sweep} == where
    assert set(where.values()) == {0, 1}
    assert [g["index"] for g in results.environment["gpus"]] == [0, 1]
    assert all(r.status == "ok" and len(r.samples_ms) >= 3 for r in results.sweep)
    assert results.command.endswith("--gpus 2")


def test_a_sharded_run_removes_its_temporary_folder_when_it_succeeds(sharded_run: dict) -> None:
    logs = re.findall(r"log (\S+shard-\d\.log)", sharded_run["err"])
    assert len(logs) == 2
    assert not Path(logs[0]).parent.exists()


def test_a_failed_worker_is_named_with_its_untimed_cases_and_no_report_is_written(
    grid_file: Path, run_temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shard.worker_command

    def command(args, k, n, out):
        return [sys.executable, "-c", "import sys; sys.exit(7)"] if k == 1 else real(args, k, n, out)

    monkeypatch.setattr(shard, "worker_command", command)
    out = tmp_path / "run"
    code, err = _stderr_of(monkeypatch, lambda: cli_main(_args(grid_file, out, "--gpus", "2")))
    assert code == shard.EXIT_WORKER_FAILED
    untimed = [c.params.case_id for c in shard.shard_plan(_opts(), 2)[1]]
    assert "error: shard 1/2 on CPU worker 1 exited with status 7 without results" in err
    assert f"untimed cases ({len(untimed)}): {', '.join(untimed)}" in err
    assert "no report written" in err and not out.exists()
    kept = re.search(r"the workers' files are kept in (\S+)", err)
    assert kept and Path(kept[1]).parent == run_temp
    assert (Path(kept[1]) / "shard-0" / "results.json").is_file()


def test_a_worker_past_the_timeout_is_killed_and_named(
    grid_file: Path, run_temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        shard, "worker_command", lambda args, k, n, out: [sys.executable, "-c", "import time; time.sleep(60)"]
    )
    start = time.monotonic()
    args = _args(grid_file, tmp_path / "run", "--gpus", "2", "--worker-timeout", "0.5")
    code, err = _stderr_of(monkeypatch, lambda: cli_main(args))
    assert code == shard.EXIT_WORKER_FAILED and time.monotonic() - start < 20
    assert "error: shard 0/2 on CPU worker 0 timed out after" in err and "and was killed" in err
    assert not (tmp_path / "run").exists()


def test_an_interrupted_sharded_run_removes_its_workers_partial_files(
    grid_file: Path, run_temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker writes a complete-looking results.json and keeps running; Ctrl-C (SIGINT to
    this process) comes once both have started. SIGINT is set to its default for the test: a
    test process started as a background job inherits it ignored, and the run would then wait
    for its workers instead of being interrupted."""
    worker = "import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); p.mkdir(); (p / 'results.json').write_text('{}'); time.sleep(60)"
    timers: list[threading.Timer] = []

    def command(args, k, n, out):
        if k == n - 1 and not timers:  # once: a failed run builds each worker's command again
            timers.append(threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)))
            timers[0].start()
        return [sys.executable, "-c", worker, str(out)]

    monkeypatch.setattr(shard, "worker_command", command)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        code, err = _stderr_of(
            monkeypatch, lambda: cli_main(_args(grid_file, tmp_path / "run", "--gpus", "2"))
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    timers[0].join()
    assert code == 130 and time.monotonic() - start < 30
    assert "interrupted" in err
    assert not any(run_temp.glob("verify-attention-shards-*")) and not (tmp_path / "run").exists()


def test_an_interrupted_tp_run_removes_its_files_and_its_ranks_stop_without_a_traceback(
    grid_file: Path, tmp_path: Path
) -> None:
    """A real Ctrl-C: SIGINT to the whole process group, the ranks included, while they start."""
    temp = tmp_path / "temp"
    temp.mkdir()
    log = tmp_path / "stderr.log"
    # SIGINT at its default even where this test runs with it ignored (a background job)
    main = "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); from harness.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", main, *_args(grid_file, tmp_path / "tp", "--tp", "2")],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while (
            not any(temp.glob("verify-attention-tp-*"))
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        time.sleep(1.0)  # the ranks are starting (importing torch) or timing
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130, log.read_text()
        while time.monotonic() < deadline:  # the ranks and multiprocessing's helper exit too
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("processes of the interrupted run are still running")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "interrupted" in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "leaked" not in text, text
    assert not any(temp.glob("verify-attention-tp-*")) and not (tmp_path / "tp").exists()


@pytest.mark.parametrize("tp", [2, 8])
def test_a_tp_cpu_run_pairs_every_rounds_samples_across_its_ranks(
    grid_file: Path, run_temp: Path, tmp_path: Path, tp: int
) -> None:
    """Two ranks, and the eight of the target box (8 GPUs, TP8: one head a rank here)."""
    out = tmp_path / "tp"
    assert cli_main(_args(grid_file, out, "--tp", str(tp))) == 0
    results = load_results(out)
    assert len(results.sweep) == (1 + tp) * len(CASES)
    for i, case in enumerate(CASES):
        step, *ranks = results.sweep[(1 + tp) * i : (1 + tp) * (i + 1)]
        assert step.case_id == f"{case}-tp{tp}" and step.params["num_heads"] == 8 and step.tp_size == tp
        assert [r.case_id for r in ranks] == [f"{case}-tp{tp}-rank{k}" for k in range(tp)]
        assert [(r.tp_rank, r.gpu_index, r.params["num_heads"]) for r in ranks] == [
            (k, k, 8 // tp) for k in range(tp)
        ]
        n = len(ranks[0].samples_ms)
        assert n >= 3 and all(len(r.samples_ms) == n for r in ranks)
        assert step.samples_ms == [max(s) for s in zip(*(r.samples_ms for r in ranks), strict=True)]
        assert step.bytes == sum(r.bytes for r in ranks)
        assert all(r.repro.endswith(f"--tp {tp}") for r in ranks)
    assert (out / "index.html").is_file() and not any(run_temp.iterdir())


# ---------------------------------------------------------------------------------------------
# One GPU


GPU_GRID = """
[timing]
warmup = 2
min_samples = 10
max_samples = 20
max_time_s = 0.5
[[group]]
name = "one"
impls = ["verify-attn-cuda"]
batch_size = [1]
prefix_len = [4096, 16384]
num_heads = [16]
tree_size = [16]
modes = ["cold"]
"""


def _gpu_run(tmp_path: Path, *extra: str) -> Results:
    grid = tmp_path / "gpu.toml"
    grid.write_text(GPU_GRID)
    out = tmp_path / "run"
    code = cli_main(["sweep", "--grid", str(grid), "--impls", "verify-attn-cuda", "--out", str(out), *extra])
    assert code == 0
    return load_results(out)


@pytest.mark.gpu
def test_a_sharded_run_on_one_gpu_records_its_uuid_and_judges_rows_by_its_ceilings(tmp_path: Path) -> None:
    results = _gpu_run(tmp_path, "--gpus", "1")
    (gpu,) = results.environment["gpus"]
    ceilings = Ceilings.from_json(gpu["ceilings"])
    assert gpu["uuid"] and gpu["index"] == 0
    for r in results.sweep:
        assert r.gpu_index == 0 and r.gpu_uuid == gpu["uuid"]
        assert r.floor_ms == pytest.approx(floor_ms(r.bytes, r.flops, ceilings), rel=1e-3)


@pytest.mark.gpu
def test_tp_on_one_gpu_gives_a_step_equal_to_its_only_rank(tmp_path: Path) -> None:
    results = _gpu_run(tmp_path, "--tp", "1")
    steps = [r for r in results.sweep if r.tp_rank is None]
    ranks = {r.case_id: r for r in results.sweep if r.tp_rank == 0}
    assert len(steps) == 2
    for step in steps:
        assert step.samples_ms == ranks[f"{step.case_id}-rank0"].samples_ms
        assert step.status == "ok" and step.pct_of_floor is not None


def test_spin_outlasts_the_whole_enqueue() -> None:
    """A sample's spin (one GPU and TP rounds alike) covers twice a call's host time plus a
    margin, capped."""
    from harness.timing import MAX_SPIN_MS, SPIN_MARGIN_MS, spin_ms

    assert spin_ms([0.02, 0.03, 0.025]) == pytest.approx(2 * 0.025 + SPIN_MARGIN_MS)
    assert spin_ms([5.0]) == MAX_SPIN_MS


def test_a_cpu_run_of_workers_takes_no_gpu_lock_and_a_cuda_run_does(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = []
    monkeypatch.setattr(timing, "exclusive_gpu", lambda: taken.append("lock") or contextlib.nullcontext())
    with timing.gpu_lock_for(_opts().device):
        pass
    assert taken == []
    with timing.gpu_lock_for(replace(_opts(), device=torch.device("cuda")).device):
        pass
    assert taken == ["lock"]


def test_the_workers_folder_goes_when_the_run_ends_in_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(timing.GpuLockError), shard.workers_folder("verify-attention-shards-"):
        raise timing.GpuLockError("cannot open the GPU lock file")
    assert list(tmp_path.iterdir()) == []


def test_the_workers_reference_notes_merge_into_one_per_implementation() -> None:
    from harness.sweep import reference_skip_note

    notes = [
        "grid g: plumbing",
        reference_skip_note("oracle", "10", ["B1-P65536-T16-H8-shuffled", "B1-P131072-T16-H8-shuffled"]),
        "grid g: plumbing",
        reference_skip_note("oracle", "10", ["B1-P200000-T16-H8-shuffled"]),
    ]
    assert shard._merged_skip_notes(notes) == [
        "grid g: plumbing",
        reference_skip_note(
            "oracle",
            "10",
            ["B1-P65536-T16-H8-shuffled", "B1-P131072-T16-H8-shuffled", "B1-P200000-T16-H8-shuffled"],
        ),
        "grid g: plumbing",
    ]


@pytest.mark.parametrize("several", [["--gpus", "2"], ["--tp", "2"]], ids=["gpus", "tp"])
def test_a_run_whose_every_implementation_is_unavailable_exits_2_without_a_report(
    grid_file: Path, tmp_path: Path, run_temp: Path, monkeypatch: pytest.MonkeyPatch, several: list[str]
) -> None:
    """As a plain sweep does (it refuses before timing): the workers find the kernel unavailable
    on the CPU, time nothing, and the parent writes no empty report and says why."""
    out = tmp_path / "run"
    argv = [
        "sweep",
        "--grid",
        str(grid_file),
        "--device",
        "cpu",
        "--impls",
        "verify-attn-cuda",
        "--out",
        str(out),
    ]
    code, err = _stderr_of(monkeypatch, lambda: cli_main([*argv, *several]))
    assert code == 2, err
    assert "nothing to time on this box: no implementation selected is available (verify-attn-cuda:" in err
    assert not out.exists()
