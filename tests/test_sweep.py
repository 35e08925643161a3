"""Sweep grids, case ids and batches, and a whole sweep on the CPU with stand-in implementations.

The end-to-end tests run ``python -m harness sweep --device cpu`` against implementations
registered only for the test (a correct one, a faster one, one returning NaN, one raising, an
unavailable one and a reference), so they check the sweep's plumbing in seconds: error rows,
speedups, the reference size cap, repro commands, the output folder and exit status.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from harness import nvml, registry, report, sweep, timing, tree
from harness.batch import QK_DIM, VerifyBatch
from harness.cases import MAX_TREE_SIZE, CaseParams, build_batch
from harness.cli import main as cli_main
from harness.env import environment
from harness.registry import Implementation
from harness.results import REPORTS_DIR, Results, SweepRow, load_results
from harness.sweep import (
    GridError,
    load_grid,
    parse_grid,
    run_dir_name,
    select_cases,
    throttle_flags,
    with_speedups,
)

KNOWN = ["verify-attn-cuda", "sglang-triton-ps1", "oracle"]


# ---------------------------------------------------------------------------------------------
# Case ids and batches


def test_case_id_reads_batch_prefix_tree_heads_layout() -> None:
    assert CaseParams(1, 65536, 8, 16).case_id == "B1-P65536-T16-H8-shuffled"
    assert CaseParams(4, 1024, 128, 256, layout="contiguous").case_id == "B4-P1024-T256-H128-contiguous"


def test_case_id_names_a_tree_kind_other_than_eagle_except_for_a_single_node() -> None:
    assert CaseParams(1, 4096, 16, 64, tree="chain").case_id == "B1-P4096-T64-H16-shuffled-chain"
    assert CaseParams(1, 4096, 16, 1, tree="chain").case_id == "B1-P4096-T1-H16-shuffled"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"prefix_len": -1}, "prefix_len must be >= 0, got -1"),
        ({"tree": "bush"}, "tree must be one of chain, eagle, ddtree, random, got 'bush'"),
        ({"layout": "paged"}, "layout must be one of contiguous, shuffled, got 'paged'"),
        ({"tree_size": 458}, "tree_size must be <= 457 with tree 'eagle'"),
    ],
)
def test_case_params_reject_bad_values_naming_the_field(kwargs: dict, message: str) -> None:
    base = {"batch_size": 1, "prefix_len": 16, "num_heads": 8, "tree_size": 4}
    with pytest.raises(ValueError, match=message):
        CaseParams(**{**base, **kwargs})


def test_the_eagle_tree_size_limit_is_the_most_nodes_its_builder_makes() -> None:
    limit = MAX_TREE_SIZE["eagle"]
    assert len(tree.eagle_tree(limit, 0)) == limit
    with pytest.raises(ValueError, match=f"exceeds the {limit} candidates"):
        tree.eagle_tree(limit + 1, 0)
    assert build_batch(CaseParams(1, 16, 1, limit), "cpu").num_draft == (limit,)
    assert CaseParams(1, 16, 1, limit + 1, tree="chain").tree_size == limit + 1  # no limit there


def test_build_batch_has_the_shapes_and_offsets_of_its_params() -> None:
    p = CaseParams(batch_size=3, prefix_len=100, num_heads=8, tree_size=4, tree="random")
    b = build_batch(p, "cpu")
    assert isinstance(b, VerifyBatch)
    assert b.q.shape == (12, 8, QK_DIM) and b.q.dtype == torch.bfloat16
    assert b.kv_cache.shape == (312, QK_DIM)
    assert b.qo_indptr.tolist() == [0, 4, 8, 12]
    assert b.kv_indptr.tolist() == [0, 104, 208, 312]
    assert b.prefix_lens == (100, 100, 100) and b.num_draft == (4, 4, 4)
    assert all(par[0] == -1 and len(par) == 4 for par in b.parents)


def test_shuffled_layout_scatters_every_slot_once_and_contiguous_keeps_order() -> None:
    shuffled = build_batch(CaseParams(1, 1000, 8, 16), "cpu").kv_indices
    contiguous = build_batch(CaseParams(1, 1000, 8, 16, layout="contiguous"), "cpu").kv_indices
    assert sorted(shuffled.tolist()) == list(range(1016))
    assert shuffled.tolist() != list(range(1016))
    assert contiguous.tolist() == list(range(1016))


def test_build_batch_is_seeded_and_input_sets_differ() -> None:
    p = CaseParams(1, 500, 8, 4)
    a, b, c = build_batch(p, "cpu"), build_batch(p, "cpu"), build_batch(p, "cpu", input_set=1)
    assert (
        torch.equal(a.q, b.q)
        and torch.equal(a.kv_cache, b.kv_cache)
        and torch.equal(a.kv_indices, b.kv_indices)
    )
    assert not torch.equal(a.q, c.q) and not torch.equal(a.kv_cache, c.kv_cache)
    assert a.parents == c.parents


# ---------------------------------------------------------------------------------------------
# Grids


@pytest.mark.parametrize("name", ["quick", "default", "full"])
def test_shipped_grids_parse_and_name_only_registered_implementations(name: str) -> None:
    grid = load_grid(name)
    grid.check_impls(KNOWN)
    plan = grid.plan(KNOWN)
    ids = [c.params.case_id for c in plan]
    assert plan and len(ids) == len(set(ids))
    assert any(r.impl == "verify-attn-cuda" for c in plan for r in c.runs)


def test_quick_grid_times_the_kernel_in_both_modes_and_the_baselines_on_a_subset() -> None:
    plan = load_grid("quick").plan(KNOWN)
    kernel = [c for c in plan if any(r.impl == "verify-attn-cuda" for r in c.runs)]
    baseline = [c for c in plan if any(r.impl == "sglang-triton-ps1" for r in c.runs)]
    assert all(r.modes == ("cold", "graph") for c in kernel for r in c.runs if r.impl == "verify-attn-cuda")
    assert 0 < len(baseline) < len(kernel)


# The issue's target cases: B=1, P in {32k, 64k, 128k, 200k}, H in {8, 16, 64}, T in {16, 64}.
TARGET_CASES = [
    f"B1-P{p}-T{t}-H{h}-shuffled"
    for p in (32768, 65536, 131072, 200000)
    for h in (8, 16, 64)
    for t in (16, 64)
]


@pytest.mark.parametrize("grid", ["default", "sm120", "full"])
def test_the_grids_that_say_so_time_the_kernel_on_every_target_case(grid: str) -> None:
    impls = [*KNOWN, "verify-attn-cuda-small", "verify-attn-cuda-small-m32"]
    plan = {c.params.case_id: c for c in load_grid(grid).plan(impls) if c.runs}
    missing = [cid for cid in TARGET_CASES if cid not in plan]
    assert not missing, f"{grid} lacks {missing}"
    assert all(any(r.impl.startswith("verify-attn-cuda") for r in plan[cid].runs) for cid in TARGET_CASES)


def test_default_grid_covers_every_axis_of_the_design() -> None:
    params = [c.params for c in load_grid("default").plan(KNOWN)]
    assert {p.prefix_len for p in params} >= {1024, 262144}
    assert {p.num_heads for p in params} == {8, 16, 64, 128}
    assert {p.tree_size for p in params} == {1, 4, 16, 64, 256}
    assert {p.layout for p in params} == {"contiguous", "shuffled"}
    assert len({p.batch_size for p in params}) > 1 and len({p.tree for p in params}) > 1


def test_default_grid_times_the_tp8_serving_shape_alone_and_in_batches() -> None:
    # H=8 T=16 is a Kimi-K2 rank's call at TP8: B=1 among the targets, B=2-8 in "serving-h8".
    ids = {c.params.case_id for c in load_grid("default").plan(KNOWN) if c.runs}
    wanted = {f"B{b}-P{p}-T16-H8-shuffled" for b in (1, 2, 4, 8) for p in (32768, 65536)}
    assert wanted <= ids, sorted(wanted - ids)


GRID = """
description = "test"
[timing]
min_samples = 5
max_samples = 10
[reference]
max_gflop = 1.0
[[group]]
name = "main"
batch_size = [1]
prefix_len = [64, 256]
num_heads = [8]
tree_size = [1, 4]
tree = ["chain", "random"]
[[group]]
name = "extra"
impls = ["b"]
batch_size = [2]
prefix_len = [64]
num_heads = [8]
tree_size = [4]
modes = ["cold"]
[group.timing]
max_samples = 7
"""


def test_grid_groups_expand_to_the_product_of_their_axes() -> None:
    grid = parse_grid(GRID, name="t", source="t.toml")
    main, extra = grid.groups
    # T1 is one case whatever the tree kind: 2 prefixes x (1 + 2 tree kinds at T4)
    assert [c.case_id for c in main.cases] == [
        "B1-P64-T1-H8-shuffled",
        "B1-P64-T4-H8-shuffled-chain",
        "B1-P64-T4-H8-shuffled-random",
        "B1-P256-T1-H8-shuffled",
        "B1-P256-T4-H8-shuffled-chain",
        "B1-P256-T4-H8-shuffled-random",
    ]
    assert main.impls is None and main.modes == ("cold", "graph")
    assert extra.impls == ("b",) and extra.modes == ("cold",)
    assert (main.timing.min_samples, main.timing.max_samples, extra.timing.max_samples) == (5, 10, 7)
    assert extra.timing.min_samples == 5  # inherited from [timing]
    assert grid.reference_max_gflop == 1.0


def test_plan_orders_implementations_as_given_and_applies_group_filters() -> None:
    grid = parse_grid(GRID, name="t", source="t.toml")
    plan = grid.plan(["b", "a"], modes=("cold",))
    by_id = {c.params.case_id: c for c in plan}
    assert [r.impl for r in by_id["B1-P64-T1-H8-shuffled"].runs] == ["b", "a"]
    assert [r.impl for r in by_id["B2-P64-T4-H8-shuffled"].runs] == ["b"]
    assert all(r.modes == ("cold",) for c in plan for r in c.runs)


def test_case_filter_picks_the_exact_id_alone_or_every_id_containing_it() -> None:
    ids = ["B1-P64-T4-H8-shuffled", "B1-P64-T4-H8-shuffled-chain", "B1-P256-T4-H8-shuffled"]
    assert select_cases(ids, "B1-P64-T4-H8-shuffled") == ["B1-P64-T4-H8-shuffled"]
    assert select_cases(ids, "P64") == ids[:2]
    assert select_cases(ids, "") == ids


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[group]]\nname = 'g'\nbatch_size = [1]\n", r"t\.toml, group 'g': missing axes \['prefix_len'"),
        (GRID.replace("num_heads = [8]\ntree_size = [1, 4]", "num_heads = 8\ntree_size = [1, 4]"),
         r"t\.toml, group 'main': num_heads must be a non-empty list of integers, got 8"),
        (GRID.replace('tree = ["chain", "random"]', 'tree = ["bush"]'), r"tree has \['bush'\]; expected values among"),
        (GRID.replace('modes = ["cold"]', 'modes = ["warm"]'), r"modes has \['warm'\]"),
        (GRID.replace("[timing]", "[timing]\nsamples = 3"), r"\[timing\]: unknown timing keys \['samples'\]"),
        (GRID.replace("max_samples = 7", "max_samples = 2"), r"group 'extra': timing needs 1 <= min_samples <= max_samples"),
        (GRID.replace('modes = ["cold"]', 'modes = ["cold"]\ncolour = "red"'), r"group 'extra': unknown keys \['colour'\]"),
        ("speed = 1\n" + GRID, r"unknown top-level keys \['speed'\]"),
        ("description = 'no groups'\n", r"expected at least one \[\[group\]\] table"),
        ("[[group]\n", r"t\.toml: not valid TOML"),
        (GRID.replace("max_gflop = 1.0", "max_gflp = 1.0"),
         r"t\.toml, \[reference\]: unknown keys \['max_gflp'\]; expected among \['max_gflop'\]"),
        ("reference = 5\n" + GRID.replace("[reference]\nmax_gflop = 1.0\n", ""),
         r"t\.toml: reference must be a \[reference\] table \(max_gflop = \.\.\.\), got 5"),
        (GRID.replace("tree_size = [1, 4]", "tree_size = [1, 4, 500]").replace('tree = ["chain", "random"]', ""),
         r"t\.toml, group 'main': case: tree_size must be <= 457 with tree 'eagle'.*got 500"),
        (GRID.replace('modes = ["cold"]', 'modes = ["cold", "cold"]'),
         r"t\.toml, group 'extra': modes lists cold more than once; expected each once"),
    ],
    ids=["missing-axis", "axis-not-list", "bad-tree", "bad-mode", "bad-timing-key", "min-above-max",
         "bad-group-key", "bad-top-key", "no-group", "bad-toml", "bad-reference-key", "reference-not-a-table",
         "tree-too-big-for-its-kind", "mode-twice"],
)  # fmt: skip
def test_bad_grids_are_rejected_naming_file_group_and_key(text: str, message: str) -> None:
    with pytest.raises(GridError, match=message):
        parse_grid(text, name="t", source="t.toml")


def test_a_case_and_implementation_in_two_groups_is_an_error_when_the_grid_is_read() -> None:
    text = GRID.replace(
        'impls = ["b"]\nbatch_size = [2]', 'impls = ["b"]\ntree = ["chain"]\nbatch_size = [1]'
    )
    with pytest.raises(
        GridError, match="t.toml: case B1-P64-T4-H8-shuffled-chain with b is in groups 'main' and 'extra'"
    ):
        parse_grid(text, name="t", source="t.toml")


def _group(name: str, impls: str = "") -> str:
    return f"""
[[group]]
name = "{name}"
{impls}
batch_size = [1]
prefix_len = [64]
num_heads = [8]
tree_size = [4]
"""


def test_two_groups_without_impls_that_share_a_case_overlap_in_every_implementation() -> None:
    with pytest.raises(
        GridError,
        match="t.toml: case B1-P64-T4-H8-shuffled with every implementation is in groups 'g' and 'g'",
    ):
        parse_grid(_group("g") + _group("g"), name="t", source="t.toml")


def test_groups_that_share_a_case_but_no_implementation_do_not_overlap() -> None:
    grid = parse_grid(
        _group("g1", 'impls = ["a", "b"]') + _group("g2", 'impls = ["c"]'), name="t", source="t.toml"
    )
    (case,) = grid.plan(["a", "b", "c"])
    assert [r.impl for r in case.runs] == ["a", "b", "c"]
    with pytest.raises(GridError, match="case B1-P64-T4-H8-shuffled with b, c is in groups 'g1' and 'g2'"):
        parse_grid(
            _group("g1", 'impls = ["a", "b", "c"]') + _group("g2", 'impls = ["c", "b"]'),
            name="t",
            source="t.toml",
        )


def test_a_group_naming_an_unknown_implementation_is_an_error() -> None:
    grid = parse_grid(GRID, name="t", source="t.toml")
    with pytest.raises(GridError, match=r"group 'extra': impls has unknown implementations \['b'\]"):
        grid.check_impls(["a"])


def test_unknown_grid_name_lists_the_shipped_grids() -> None:
    with pytest.raises(GridError, match="expected a name among default, full, quick"):
        load_grid("nightly")


def test_a_group_that_is_not_a_table_is_an_error_naming_the_group() -> None:
    with pytest.raises(GridError, match=r"t\.toml: group #1 must be a \[\[group\]\] table, got 1"):
        parse_grid("group = [1, 2]\n", name="t", source="t.toml")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("key", ["max_time_s", "rel_ci"])
@pytest.mark.parametrize("table", ["[timing]", "[group.timing]"])
def test_a_non_finite_timing_value_is_an_error_naming_the_key(table: str, key: str, value: str) -> None:
    where = r"\[timing\]" if table == "[timing]" else "group 'extra'"
    with pytest.raises(GridError, match=rf"{where}: timing\.{key} must be a finite non-negative number"):
        parse_grid(GRID.replace(table, f"{table}\n{key} = {value}"), name="t", source="t.toml")


def test_a_nan_reference_cap_is_an_error() -> None:
    with pytest.raises(GridError, match=r"\[reference\]: max_gflop must be a non-negative number, got nan"):
        parse_grid(GRID.replace("max_gflop = 1.0", "max_gflop = nan"), name="t", source="t.toml")


# ---------------------------------------------------------------------------------------------
# Rows


def _row(impl: str, median: float, status: str = "ok", mode: str = "cold", case: str = "c1") -> SweepRow:
    samples = [median] if status == "ok" else []
    return SweepRow(case, impl, {}, mode, samples, median, 0.0, median, median, 1, 1, status=status)


def test_speedups_compare_medians_within_a_case_and_mode_only() -> None:
    rows = with_speedups(
        [
            _row("fast", 1.0),
            _row("slow", 4.0),
            _row("broken", 0.0, status="error"),
            _row("slow", 2.0, mode="graph"),
            _row("fast", 1.0, case="c2"),
        ]
    )
    assert rows[0].speedup == {"slow": 4.0}
    assert rows[1].speedup == {"fast": 0.25}
    assert rows[2].speedup == {} and rows[3].speedup == {} and rows[4].speedup == {}


def test_environment_on_the_cpu_names_versions_and_no_gpu() -> None:
    env = environment(torch.device("cpu"))
    assert env["gpu"] is None and env["build_flags"] is None
    assert env["torch"] == torch.__version__ and env["python"].count(".") == 2


def test_throttle_flags_name_clock_lowering_reasons_from_either_snapshot() -> None:
    idle = {"throttle_reasons": ["gpu_idle"]}
    capped = {"throttle_reasons": ["sw_power_cap", "gpu_idle"]}
    assert throttle_flags(idle, capped) == (True, ["sw_power_cap"])
    assert throttle_flags(capped, {"throttle_reasons": ["hw_thermal_slowdown"]}) == (
        True,
        ["sw_power_cap", "hw_thermal_slowdown"],
    )
    assert throttle_flags(idle, {"throttle_reasons": ["applications_clocks_setting"]}) == (False, [])
    assert throttle_flags(None, None) == (False, [])


def test_a_cap_during_the_samples_that_is_over_by_the_second_snapshot_is_flagged() -> None:
    """The current reasons of two snapshots see the samples' two ends only; NVML's cumulative
    violation time sees a power or thermal cap between them."""
    before = {"throttle_reasons": ["gpu_idle"], "violation_ns": {"power": 10_000_000, "thermal": 0}}
    after = {"throttle_reasons": ["gpu_idle"], "violation_ns": {"power": 14_500_000, "thermal": 0}}
    assert throttle_flags(before, after) == (True, ["power_capped_4.5ms_during_samples"])
    assert throttle_flags(before, before) == (False, [])
    unknown = {"throttle_reasons": ["none"], "violation_ns": {"power": None, "thermal": None}}
    assert throttle_flags(unknown, unknown) == (False, [])


def _timing_of(samples: list[float], spans: list[tuple[float, float]] | None) -> timing.Timing:
    return timing.Timing("cold", samples, timing.summarize(samples), "flush", "", spans)


def test_a_row_with_capped_samples_is_throttled_and_says_how_many() -> None:
    """The row's snapshots saw nothing; NVML's readings while the samples ran saw a cap during
    two of four. The row is throttled, names the count, and keeps which samples they were."""
    t = _timing_of([1.0, 1.1, 1.0, 1.2], None)
    idle = dict.fromkeys(sweep.ROW_NVML_FIELDS, 0) | {"throttle_reasons": ["gpu_idle"]}
    ids = dict(case_id="c", impl="i", params={}, mode="cold", repro="")
    row = sweep.timed_row(t, 1, 1, None, (idle, idle), throttled_samples=[1, 3], **ids)
    assert row.throttled and row.throttle_reasons == ["capped_during_2_of_4_samples"]
    assert row.throttled_samples == [1, 3]
    clean = sweep.timed_row(t, 1, 1, None, (idle, idle), throttled_samples=[], **ids)
    assert not clean.throttled and clean.throttle_reasons == [] and clean.throttled_samples == []
    unread = sweep.timed_row(t, 1, 1, None, (idle, idle), **ids)
    assert not unread.throttled and unread.throttled_samples is None


def test_read_per_sample_a_row_keeps_its_snapshots_evidence_beside_its_samples() -> None:
    """NVML may publish its violation time late, so a cap during the samples can show only in
    the second snapshot: a row whose samples all read clean is still throttled by its
    snapshots, and one whose samples did not names the count first, then the snapshots' reasons."""
    t = _timing_of([1.0, 1.1, 1.0, 1.2], None)
    base = dict.fromkeys(sweep.ROW_NVML_FIELDS, 0)
    before = base | {"throttle_reasons": ["sw_power_cap"], "violation_ns": {"power": 0, "thermal": 0}}
    after = base | {"throttle_reasons": ["gpu_idle"], "violation_ns": {"power": 9_000_000, "thermal": 0}}
    ids = dict(case_id="c", impl="i", params={}, mode="cold", repro="")
    snapshots = ["sw_power_cap", "power_capped_9ms_during_samples"]
    clean = sweep.timed_row(t, 1, 1, None, (before, after), throttled_samples=[], **ids)
    assert clean.throttled and clean.throttle_reasons == snapshots and clean.throttled_samples == []
    hot = sweep.timed_row(t, 1, 1, None, (before, after), throttled_samples=[0], **ids)
    assert hot.throttled and hot.throttle_reasons == ["capped_during_1_of_4_samples", *snapshots]
    unread = sweep.timed_row(t, 1, 1, None, (before, after), **ids)
    assert unread.throttled and unread.throttle_reasons == snapshots


def test_samples_are_flagged_only_where_a_poller_read_them() -> None:
    spans = [(0.1, 0.2), (1.1, 1.2)]
    t = _timing_of([1.0, 1.0], spans)

    class Poller:
        failed = ""
        max_sm_mhz = None
        readings = [nvml.Reading(t, t, mask, 0, 0) for t, mask in ((0.0, 0), (1.0, 0x4), (2.0, 0))]

    assert sweep.sample_flags(t, Poller()) == ([0, 1], None)
    # the board's maximum clock reaches the flags: a cap read at the maximum clock flags nothing
    at_max = Poller()
    at_max.max_sm_mhz = 1980
    at_max.readings = [nvml.Reading(r.t, r.t_end, r.reasons, 0, 0, 1980) for r in Poller.readings]
    assert sweep.sample_flags(t, at_max) == ([], 1940.4)
    assert sweep.sample_flags(_timing_of([1.0, 1.0], None), Poller()) == (None, None)  # the CPU: no spans
    assert sweep.sample_flags(t, None) == (None, None)
    broken = Poller()
    broken.failed = "NVML query failed: GPU is lost"
    assert sweep.sample_flags(t, broken) == (None, None)
    empty = Poller()
    empty.readings = []
    assert sweep.sample_flags(t, empty) == (None, None)


def test_run_dir_name_has_utc_time_grid_gpu_slug_and_short_sha() -> None:
    now = datetime(2025, 11, 29, 10, 15, 3, tzinfo=timezone.utc)
    assert (
        run_dir_name("default", "NVIDIA H200", "3c9d2e4f5a6b", now)
        == "20251129T101503-sweep-default-nvidia-h200-3c9d2e4"
    )
    assert run_dir_name("quick", None, None, now) == "20251129T101503-sweep-quick-cpu-nogit"


# ---------------------------------------------------------------------------------------------
# A whole sweep on the CPU


def _matmul_impl(
    name: str, *, repeat: int = 1, nan: bool = False, raises: bool = False, config: str = "", **kw
) -> Implementation:
    """A stand-in: attention-shaped work on the CPU (``repeat`` times), optionally broken; a
    ``config`` is what its prepared call says it runs (``impl_config``)."""

    def prepare(batch: VerifyBatch):
        if raises:
            raise RuntimeError(f"{name} cannot run this case")
        q = batch.q[:, :, :512].float()
        v = batch.kv_cache[:64, :512].float()

        def run():
            for _ in range(repeat):
                out = q @ v.T @ v
            if nan:
                out[0, 0, 0] = float("nan")
            return out, None

        if config:
            run.impl_config = f"{config} at P={batch.prefix_lens[0]}"
        return run

    return Implementation(
        name=name,
        description="test stand-in",
        availability=kw.pop("availability", lambda device: (True, "")),
        prepare=prepare,
        device_kind="any",
        **kw,
    )


STAND_INS = [
    _matmul_impl("quick-impl"),
    _matmul_impl("slow-impl", repeat=8, config="repeat-8"),
    _matmul_impl("nan-impl", nan=True),
    _matmul_impl("raising-impl", raises=True),
    _matmul_impl("gpu-only-impl", availability=lambda device: (False, "needs a CUDA device, got cpu")),
    _matmul_impl("reference-impl", is_reference=True),
]

CPU_GRID = """
description = "plumbing check"
[timing]
warmup = 1
min_samples = 5
max_samples = 8
max_time_s = 0.5
rel_ci = 0.05
[reference]
max_gflop = 0.01
[[group]]
name = "all"
batch_size = [1]
prefix_len = [64, 4096]
num_heads = [8]
tree_size = [4]
"""


@pytest.fixture()
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "implementations", lambda: list(STAND_INS))


@pytest.fixture(scope="module")
def cpu_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One sweep for every test that reads it: a few seconds on the CPU."""
    tmp_path = tmp_path_factory.mktemp("cpu-sweep")
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    out = tmp_path / "run"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(registry, "implementations", lambda: list(STAND_INS))
        code = cli_main(["sweep", "--grid", str(grid), "--device", "cpu", "--out", str(out)])
    return {"code": code, "out": out, "results": load_results(out), "grid": grid, "err": err.getvalue()}


def test_a_sweep_reads_its_poller_per_row_and_keeps_each_rows_flagged_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring a GPU run takes, on the CPU: the run makes one poller, each timed row clears
    it and hands it to ``measure`` as the monitor, and the row keeps ``flag_samples``'s answer.
    Here every sample i spans (i, i + 0.5) and the poller saw a cap at t = 1.25 only: sample 1."""
    snap = dict.fromkeys(("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w"), 0) | {
        "throttle_reasons": ["none"],
        "violation_ns": {"power": 0, "thermal": 0},
    }
    monkeypatch.setattr(nvml, "snapshot", lambda device: (dict(snap), ""))

    class FakePoller:
        cleared = 0
        failed = ""
        max_sm_mhz = 1980
        readings: list = []

        def clear(self) -> None:
            FakePoller.cleared += 1
            times = [k / 4 for k in range(41)]  # a reading every 0.25 s
            # a cap at t=1.25 with the clock lowered, and one at t=5 at a full clock
            self.readings = [
                nvml.Reading(t, t, 0x4 if t in (1.25, 5.0) else 0, 0, 0, 1500 if t == 1.25 else 1980)
                for t in times
            ]

        def read(self) -> None:  # the CPU path never reads it
            raise AssertionError("read on the CPU")

    poller = FakePoller()
    monkeypatch.setattr(nvml.Poller, "of", classmethod(lambda cls, device: (poller, "")))
    handed = []
    real_measure = sweep.measure

    def measure(*args, monitor=None, **kwargs):
        handed.append(monitor)
        t = real_measure(*args, **kwargs)
        return replace(t, spans=[(float(i), i + 0.5) for i in range(len(t.samples_ms))])

    monkeypatch.setattr(sweep, "measure", measure)
    monkeypatch.setattr(registry, "implementations", lambda: [STAND_INS[0]])
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    out = tmp_path / "run"
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli_main(["sweep", "--grid", str(grid), "--device", "cpu", "--out", str(out)]) == 0
    rows = load_results(out).sweep
    assert len(rows) == 2 and handed == [poller, poller] and FakePoller.cleared == 2
    for r in rows:
        assert len(r.samples_ms) > 5  # sample 5 spans the cap at t=5, read at a full clock
        assert r.throttled_samples == [1] and r.throttled and r.throttle_clock_line_mhz == 1940.4
        assert r.throttle_reasons == [f"capped_during_1_of_{len(r.samples_ms)}_samples"]


def test_cpu_sweep_writes_results_and_report_and_exits_1_on_error_rows(cpu_sweep: dict) -> None:
    assert cpu_sweep["code"] == 1
    assert (cpu_sweep["out"] / "results.json").is_file() and (cpu_sweep["out"] / "index.html").is_file()
    assert "error B1-P64-T4-H8-shuffled nan-impl cold: out contain NaN or Inf; not timed" in cpu_sweep["err"]


def test_cpu_sweep_times_healthy_implementations_with_raw_samples_and_stats(cpu_sweep: dict) -> None:
    rows = [r for r in cpu_sweep["results"].sweep if r.impl in ("quick-impl", "slow-impl")]
    assert len(rows) == 4 and all(r.status == "ok" and r.mode == "cold" for r in rows)
    for r in rows:
        # five to eight samples, unless the 0.5 s budget ran out first (a loaded box) and the note says so
        assert 5 <= len(r.samples_ms) <= 8 or (3 <= len(r.samples_ms) < 5 and "fewer samples" in r.note)
        assert r.min_ms <= r.median_ms <= r.max_ms
        assert r.bytes > 0 and r.flops > 0 and r.bandwidth_gbs > 0
        assert r.floor_ms is None and r.pct_of_floor is None  # no ceilings on the CPU
        assert r.params["prefix_len"] in (64, 4096)


def test_cpu_sweep_rows_carry_what_the_prepared_call_says_it_runs(cpu_sweep: dict) -> None:
    rows = cpu_sweep["results"].sweep
    slow = {r.params["prefix_len"]: r.impl_config for r in rows if r.impl == "slow-impl"}
    assert slow == {64: "repeat-8 at P=64", 4096: "repeat-8 at P=4096"}
    assert all(r.impl_config == "" for r in rows if r.impl == "quick-impl")


def test_cpu_sweep_records_nan_and_raising_implementations_as_untimed_error_rows(cpu_sweep: dict) -> None:
    errors = {
        r.impl: r
        for r in cpu_sweep["results"].sweep
        if r.status == "error" and r.case_id.startswith("B1-P64-")
    }
    assert set(errors) == {"nan-impl", "raising-impl"}
    assert errors["nan-impl"].note == "out contain NaN or Inf; not timed"
    assert errors["raising-impl"].note == "RuntimeError: raising-impl cannot run this case"
    assert all(r.samples_ms == [] and r.speedup == {} for r in errors.values())


def test_cpu_sweep_reports_speedups_between_timed_implementations(cpu_sweep: dict) -> None:
    rows = {(r.case_id, r.impl): r for r in cpu_sweep["results"].sweep}
    for case in ("B1-P64-T4-H8-shuffled", "B1-P4096-T4-H8-shuffled"):
        quick, slow = rows[(case, "quick-impl")], rows[(case, "slow-impl")]
        assert quick.speedup["slow-impl"] == pytest.approx(slow.median_ms / quick.median_ms, rel=1e-3)
        assert "nan-impl" not in quick.speedup


def test_cpu_sweep_skips_the_reference_above_its_size_cap_and_says_so(cpu_sweep: dict) -> None:
    results = cpu_sweep["results"]
    reference = [r for r in results.sweep if r.impl == "reference-impl"]
    assert [r.case_id for r in reference] == ["B1-P64-T4-H8-shuffled"]
    assert any(
        "reference-impl" in n and "B1-P4096-T4-H8-shuffled" in n and "0.01 GFLOP" in n for n in results.notes
    )


def test_cpu_sweep_lists_unavailable_implementations_with_their_reason(cpu_sweep: dict) -> None:
    assert cpu_sweep["results"].unavailable == [
        {"impl": "gpu-only-impl", "reason": "needs a CUDA device, got cpu"}
    ]


def test_cpu_sweep_rows_carry_a_repro_command_for_their_case(cpu_sweep: dict) -> None:
    row = next(r for r in cpu_sweep["results"].sweep if r.impl == "quick-impl")
    assert row.repro == (
        f"python -m harness sweep --grid {cpu_sweep['grid']} --case-filter {row.case_id} --impls quick-impl --modes cold --device cpu"
    )
    assert cpu_sweep["results"].command.startswith(f"python -m harness sweep --grid {cpu_sweep['grid']}")


def test_cpu_sweep_results_stay_small_with_samples_at_four_significant_digits(cpu_sweep: dict) -> None:
    doc = json.loads((cpu_sweep["out"] / "results.json").read_text())
    samples = [s for r in doc["sweep"] for s in r["samples_ms"]]
    assert samples and all(float(f"{s:.4g}") == s for s in samples)


def test_cpu_sweep_results_json_has_one_line_a_row(cpu_sweep: dict) -> None:
    """Each sweep row (samples included) is one compact line, and the text loads back to the same
    document the run holds."""
    text = (cpu_sweep["out"] / "results.json").read_text()
    doc = json.loads(text)
    assert doc == json.loads(json.dumps(cpu_sweep["results"].to_json()))
    row_lines = [line for line in text.splitlines() if line.startswith('  {"case_id":')]
    assert len(row_lines) == len(doc["sweep"]) > 1
    assert len(text.splitlines()) < len(doc) + len(doc["sweep"]) + 8


def test_results_text_refuses_nan_and_keeps_every_key_in_order() -> None:
    from harness.results import results_text

    doc = {
        "schema": "s",
        "rows": [{"a": 1, "b": [1.5, 2]}, {"a": 2, "b": []}],
        "empty": [],
        "env": {"x": None},
    }
    text = results_text(doc)
    assert json.loads(text) == doc and list(json.loads(text)) == list(doc)
    assert text.splitlines()[3:5] == ['  {"a":1,"b":[1.5,2]},', '  {"a":2,"b":[]}']
    with pytest.raises(ValueError):
        results_text({"rows": [{"x": float("nan")}]})


def test_cpu_sweep_notes_what_the_cpu_cannot_measure(cpu_sweep: dict) -> None:
    notes = " | ".join(cpu_sweep["results"].notes)
    assert "graph mode needs a CUDA device" in notes
    assert "no NVML state recorded" in notes
    assert "ceilings are measured on CUDA devices only" in notes


def test_sweep_list_prints_the_plan_without_timing(stand_ins: None, tmp_path: Path, capsys) -> None:
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    code = cli_main(
        ["sweep", "--grid", str(grid), "--list", "--impls", "quick-impl,slow-impl", "--case-filter", "P64-"]
    )
    assert code == 0
    assert capsys.readouterr().out.splitlines() == [
        "B1-P64-T4-H8-shuffled: quick-impl (cold/graph), slow-impl (cold/graph)"
    ]


def test_an_implementation_or_mode_named_twice_on_the_command_line_is_timed_once(
    stand_ins: None, tmp_path: Path, capsys
) -> None:
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    args = ["sweep", "--grid", str(grid), "--list", "--case-filter", "P64-"]
    assert cli_main([*args, "--impls", "quick-impl,quick-impl", "--modes", "cold,cold"]) == 0
    assert capsys.readouterr().out.splitlines() == ["B1-P64-T4-H8-shuffled: quick-impl (cold)"]


def test_an_implementation_listed_twice_in_a_group_is_refused_naming_it() -> None:
    with pytest.raises(GridError, match="group 'g': impls lists b more than once; expected each once"):
        parse_grid(_group("g", 'impls = ["b", "a", "b"]'), name="t", source="t.toml")


GRAPH_ONLY_GROUP = """
[[group]]
name = "graph-only"
batch_size = [2]
prefix_len = [64]
num_heads = [8]
tree_size = [4]
modes = ["graph"]
"""


def test_sweep_list_on_the_cpu_shows_only_the_modes_the_cpu_times(
    stand_ins: None, tmp_path: Path, capsys
) -> None:
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID + GRAPH_ONLY_GROUP)
    args = ["sweep", "--grid", str(grid), "--list", "--impls", "quick-impl,slow-impl"]
    assert cli_main([*args, "--device", "cpu"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "B1-P64-T4-H8-shuffled: quick-impl (cold), slow-impl (cold)",
        "B1-P4096-T4-H8-shuffled: quick-impl (cold), slow-impl (cold)",
    ]
    assert cli_main(args) == 0  # on CUDA the graph runs are listed, the graph-only case too
    assert "B2-P64-T4-H8-shuffled: quick-impl (graph), slow-impl (graph)" in capsys.readouterr().out


def test_sweep_list_with_nothing_to_list_says_why_as_a_run_would(
    stand_ins: None, tmp_path: Path, capsys
) -> None:
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    assert cli_main(["sweep", "--grid", str(grid), "--list", "--case-filter", "nomatch"]) == 2
    captured = capsys.readouterr()
    assert "no case of grid cpu matches --case-filter 'nomatch'" in captured.err and captured.out == ""


def test_sweep_list_says_where_the_reference_is_not_timed_and_a_run_of_only_those_exits_2(
    tmp_path: Path, capsys
) -> None:
    """The reference (the float64 oracle) is skipped above [reference] max_gflop: --list says so
    rather than listing a run that will not happen, and a run left with only such runs refuses."""
    args = ["sweep", "--grid", "quick", "--device", "cpu", "--case-filter", "P65536-T16-H8-"]
    assert cli_main([*args, "--list", "--impls", "oracle,verify-attn-cuda"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "B1-P65536-T16-H8-shuffled: verify-attn-cuda (cold), oracle (cold) [not timed: above [reference] "
        "max_gflop = 10]"
    ]
    for extra in (["--list"], ["--out", str(tmp_path / "run")]):
        assert cli_main([*args, *extra, "--impls", "oracle"]) == 2
        captured = capsys.readouterr()
        assert (
            "--impls oracle: the reference is not timed above the grid's [reference] max_gflop = 10 GFLOP"
            in captured.err
        )
        assert captured.out == ""
    assert not (tmp_path / "run").exists()


def test_a_grid_file_that_is_not_utf8_text_is_an_error_naming_the_option(tmp_path: Path) -> None:
    grid = tmp_path / "binary.toml"
    grid.write_bytes(bytes(range(256)))
    with pytest.raises(GridError, match=rf"--grid {grid}: cannot read {grid} as UTF-8 TOML text"):
        load_grid(str(grid))


def test_sweep_rejects_an_unknown_implementation_name(stand_ins: None, tmp_path: Path, capsys) -> None:
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    assert cli_main(["sweep", "--grid", str(grid), "--impls", "nope", "--list"]) == 2
    assert "--impls 'nope': expected a comma-separated list among" in capsys.readouterr().err


def test_sweep_without_tqdm_prints_progress_lines(
    stand_ins: None, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    args = [
        "--grid",
        str(grid),
        "--device",
        "cpu",
        "--impls",
        "quick-impl",
        "--case-filter",
        "B1-P64-T4-H8-shuffled",
    ]
    assert cli_main(["sweep", *args, "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "sweep cpu: 1/1 B1-P64-T4-H8-shuffled quick-impl cold, ~0 s left" in err
    assert "sweep cpu: 1/1 done in" in err


@pytest.mark.parametrize(
    ("failing", "other", "impls"),
    [
        (64, 4096, ["quick-impl", "reference-impl", "slow-impl"]),
        # the case after rows already timed; the reference stays skipped above its size cap
        (4096, 64, ["quick-impl", "slow-impl"]),
    ],
    ids=["first-case", "last-case"],
)
def test_a_case_that_cannot_be_built_is_error_rows_and_the_sweep_goes_on(
    stand_ins: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
    failing: int,
    other: int,
    impls: list[str],
) -> None:
    def build_batch(params: CaseParams, device, *, input_set: int = 0) -> VerifyBatch:
        if params.prefix_len == failing:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return real_build_batch(params, device, input_set=input_set)

    real_build_batch = sweep.build_batch
    monkeypatch.setattr(sweep, "build_batch", build_batch)
    out = tmp_path / "run"
    args = [*_cpu_args(tmp_path), "--out", str(out), "--impls", "quick-impl,slow-impl,reference-impl"]
    assert cli_main(args) == 1  # as for any run with error rows, its report written
    results = load_results(out)
    rows = {(r.case_id, r.impl): r for r in results.sweep}
    case = f"B1-P{failing}-T4-H8-shuffled"
    unbuilt = [r for (cid, _), r in rows.items() if cid == case]
    assert sorted(r.impl for r in unbuilt) == impls
    assert all(r.status == "error" and r.mode == "cold" and r.samples_ms == [] for r in unbuilt)
    assert unbuilt[0].note == (
        "the case's inputs could not be built: OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 GiB"
    )
    would_be = real_build_batch(CaseParams(1, failing, 8, 4), "cpu")
    assert all((r.bytes, r.flops) == (would_be.min_bytes(), would_be.flops()) for r in unbuilt)
    assert all(rows[(f"B1-P{other}-T4-H8-shuffled", i)].status == "ok" for i in ("quick-impl", "slow-impl"))
    assert any("reference-impl" in n and "B1-P4096-T4-H8-shuffled" in n for n in results.notes)
    assert f"error {case} quick-impl cold: the case's inputs could not be built" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The GPU lock


@pytest.mark.parametrize("extra", [[], ["--shard", "0/1"]], ids=["sweep", "shard-worker"])
def test_a_cpu_sweep_takes_no_gpu_lock(
    stand_ins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str]
) -> None:
    from harness import shard

    def locked(*args, **kwargs):
        raise AssertionError("a CPU sweep took the GPU lock")

    monkeypatch.setattr(timing, "exclusive_gpu", locked)
    monkeypatch.setattr(shard, "worker_lock", locked)
    monkeypatch.delenv(shard.PARENT_ENV, raising=False)
    args = [*_cpu_args(tmp_path), "--impls", "quick-impl", "--out", str(tmp_path / "run"), *extra]
    assert cli_main(args) == 0


@pytest.fixture()
def cuda_sweep(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A ``--device cuda`` sweep on this box up to its lock: what it did, in order."""
    events: list[str] = []

    def run_sweep(opts, command):
        events.append("timed")
        return Results("sweep", "t", command, git={}, environment={})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    monkeypatch.setattr(sweep, "write_sweep_report", lambda *args: events.append("written") or 0)
    return events


def test_a_cuda_sweep_times_while_it_holds_the_gpu_lock(
    stand_ins: None, cuda_sweep: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextlib.contextmanager
    def exclusive_gpu():
        cuda_sweep.append("locked")
        yield
        cuda_sweep.append("unlocked")

    monkeypatch.setattr(timing, "exclusive_gpu", exclusive_gpu)
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    assert cli_main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "run")]) == 0
    assert cuda_sweep == ["locked", "timed", "unlocked", "written"]


def test_a_gpu_lock_that_cannot_be_opened_exits_2_naming_the_lock_file(
    stand_ins: None, cuda_sweep: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    lock = tmp_path / "no-such-folder" / "gpu.lock"
    real = timing.exclusive_gpu
    monkeypatch.setattr(timing, "exclusive_gpu", lambda: real(lock))
    grid = tmp_path / "cpu.toml"
    grid.write_text(CPU_GRID)
    out = tmp_path / "run"
    assert cli_main(["sweep", "--grid", str(grid), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot open the GPU lock file {lock}: No such file or directory" in err
    assert "set TMPDIR" in err and "Traceback" not in err
    assert cuda_sweep == [] and not out.exists()


# ---------------------------------------------------------------------------------------------
# Refused before timing: exit 2, the option named, nothing written


@pytest.fixture()
def no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep that gets as far as timing fails the test."""

    def run_sweep(opts, command):
        raise AssertionError(f"the sweep started timing: {command}")

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)


def _cpu_args(tmp_path: Path, grid_text: str = CPU_GRID) -> list[str]:
    grid = tmp_path / "cpu.toml"
    grid.write_text(grid_text)
    return ["sweep", "--grid", str(grid), "--device", "cpu"]


@pytest.mark.parametrize(
    ("extra", "grid_text", "message"),
    [
        (["--case-filter", "nomatch"], CPU_GRID, "error: no case of grid cpu matches --case-filter 'nomatch'"),
        (["--modes", "graph"], CPU_GRID,
         "error: --modes graph: no mode left to time on this device (--device cpu; graph mode needs a CUDA device)"),
        (["--case-filter", "B2-"], CPU_GRID + GRAPH_ONLY_GROUP,
         "error: --device cpu: no mode left to time on this device; grid cpu times the cases "
         "--case-filter 'B2-' keeps in graph mode only"),
    ],
    ids=["no-case", "graph-mode-on-the-cpu", "graph-only-cases-on-the-cpu"],
)  # fmt: skip
def test_a_sweep_with_nothing_to_time_exits_2_naming_the_option_and_writes_nothing(
    stand_ins: None, no_timing: None, tmp_path: Path, capsys, extra: list[str], grid_text: str, message: str
) -> None:
    out = tmp_path / "run"
    assert cli_main([*_cpu_args(tmp_path, grid_text), "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("listing", [True, False], ids=["list", "run"])
@pytest.mark.parametrize(
    ("grid_text", "message"),
    [
        (CPU_GRID + CPU_GRID[CPU_GRID.index("[[group]]") :],
         "cpu.toml: case B1-P64-T4-H8-shuffled with every implementation is in groups 'all' and 'all'"),
        (CPU_GRID.replace("tree_size = [4]", "tree_size = [4, 16, 500]"),
         "cpu.toml, group 'all': case: tree_size must be <= 457 with tree 'eagle'"),
    ],
    ids=["overlapping-groups", "tree-too-big"],
)  # fmt: skip
def test_a_grid_the_sweep_cannot_plan_exits_2_before_listing_or_timing(
    stand_ins: None, no_timing: None, tmp_path: Path, capsys, grid_text: str, message: str, listing: bool
) -> None:
    out = tmp_path / "run"
    extra = ["--list"] if listing else ["--out", str(out)]
    assert cli_main([*_cpu_args(tmp_path, grid_text), *extra]) == 2
    captured = capsys.readouterr()
    assert f"error: {tmp_path / message}" in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and not out.exists()


def test_sweep_refuses_a_device_other_than_cuda_or_cpu(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["sweep", "--device", "foo", "--list"])
    assert exit_.value.code == 2
    assert "argument --device: invalid choice: 'foo'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "soon"])
def test_sweep_refuses_a_worker_timeout_that_is_not_a_positive_finite_number(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["sweep", "--device", "cpu", "--gpus", "2", "--list", "--worker-timeout", value])
    assert exit_.value.code == 2
    assert "argument --worker-timeout: expected a" in capsys.readouterr().err


def test_a_worker_timeout_without_gpus_or_tp_is_an_error(
    stand_ins: None, no_timing: None, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    assert cli_main([*_cpu_args(tmp_path), "--worker-timeout", "5", "--out", str(out)]) == 2
    assert "error: --worker-timeout 5: applies to the workers of --gpus/--tp only" in capsys.readouterr().err
    assert not out.exists()


def test_a_sweep_whose_out_is_a_file_exits_2_naming_out_before_timing(
    stand_ins: None, no_timing: None, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "taken"
    out.write_text("keep me")
    assert cli_main([*_cpu_args(tmp_path), "--out", str(out)]) == 2
    assert f"error: --out {out} is a file; expected a folder" in capsys.readouterr().err
    assert out.read_text() == "keep me"


def test_a_sweep_that_cannot_write_under_out_exits_2_and_leaves_no_folder_behind(
    stand_ins: None, no_timing: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    out = tmp_path / "new" / "run"
    assert cli_main([*_cpu_args(tmp_path), "--out", str(out)]) == 2
    assert (
        f"error: --out {out}: cannot create or write a file there (Permission denied)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "new").exists()


def test_a_sweep_without_out_checks_the_reports_folder_before_timing(
    stand_ins: None, no_timing: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    reports = tmp_path / "reports"
    reports.write_text("")
    monkeypatch.setattr(sweep, "REPORTS_DIR", reports)
    assert cli_main(_cpu_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "error: no --out: the reports folder" in err and "is a file; expected a folder" in err


def test_a_sweep_without_out_writes_under_the_repositorys_reports_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    written: list[Path] = []
    monkeypatch.setattr(report, "write_run", lambda results, out_dir: written.append(out_dir))
    run = Results("sweep", "t", "c", git={"sha": "abc1234def"}, environment={"gpu": None})
    assert sweep.write_sweep_report(run, None, "quick") == 0
    (out_dir,) = written
    assert out_dir.parent == REPORTS_DIR and REPORTS_DIR.is_absolute()
    assert out_dir.name.endswith("-sweep-quick-cpu-abc1234")


def test_a_report_that_cannot_be_shown_is_an_error_that_says_where_the_results_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Results("sweep", "t", "c", git={"sha": "abc1234def", "dirty": "no"}, environment={"gpu": None})
    assert sweep.write_sweep_report(run, str(tmp_path / "run"), "quick") == 1
    err = capsys.readouterr().err
    assert "error: the report could not be written" in err and "results.unshown.json" in err
    assert (tmp_path / "run" / "results.unshown.json").is_file()


# ---------------------------------------------------------------------------------------------
# Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _bar_output(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch, runs: int = 200) -> tuple[float, str]:
    monkeypatch.setattr(sys, "stderr", stream)
    bar = sweep.progress_bar(runs, "sweep t")
    for i in range(runs):
        bar.set_postfix_str(f"case {i}")
        bar.update()
    bar.close()
    return bar.mininterval, stream.getvalue()


def test_progress_bar_into_a_file_refreshes_every_few_seconds_not_every_run(monkeypatch) -> None:
    pytest.importorskip("tqdm")
    interval, text = _bar_output(io.StringIO(), monkeypatch)
    assert interval == sweep.FILE_REFRESH_S
    # 200 runs in well under 10 s: the bar's first and last states only
    assert text.count("sweep t:") <= 3 and "200/200" in text


def test_progress_bar_on_a_terminal_keeps_tqdms_refresh(monkeypatch) -> None:
    pytest.importorskip("tqdm")
    interval, text = _bar_output(_Terminal(), monkeypatch)
    assert interval == 0.1 and "200/200" in text


def test_a_grid_path_that_is_not_a_toml_file_is_named_as_given(tmp_path: Path) -> None:
    # not "no grid file <path>.toml", a file the user never named
    with pytest.raises(GridError, match=rf"--grid {tmp_path}: not a grid name, nor a .toml file"):
        load_grid(str(tmp_path))


def test_a_sweep_whose_every_implementation_is_unavailable_exits_2_writing_nothing(
    tmp_path: Path, capsys
) -> None:
    """An empty report with exit 0 would read as a run that passed; a worker of a --gpus run,
    which may be dealt such a share, is the exception (tests/test_shard.py)."""
    argv = ["sweep", "--grid", "quick", "--impls", "verify-attn-cuda", "--device", "cpu"]
    assert cli_main([*argv, "--out", str(tmp_path / "run")]) == 2
    assert "nothing to time on this box: verify-attn-cuda: needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_gpu_case_small_next_to_l2_is_built_with_the_input_sets_it_rotates_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU a case whose working set is below 3x L2 gets further input sets (rotated for a
    cold L2 that keeps the kernel's code), a larger one a single set (flushed)."""
    import types

    import harness.sweep

    built: list[int] = []

    def fake_build(params: object, device: object, input_set: int = 0) -> object:
        built.append(input_set)
        return types.SimpleNamespace(min_bytes=lambda: params.bytes)

    monkeypatch.setattr(harness.sweep, "build_batch", fake_build)
    l2 = 60 << 20
    for working_set, sets in ((7 << 20, 19), (100 << 20, 3), (150 << 20, 2), (200 << 20, 1)):
        built.clear()
        batches, why = harness.sweep.case_batches(
            types.SimpleNamespace(bytes=working_set), torch.device("cuda"), l2
        )
        assert why == "" and len(batches) == sets and built == list(range(sets)), (working_set, built)
