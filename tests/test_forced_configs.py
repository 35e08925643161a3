"""sm_120's tile configs as registry entries of their own (harness/impl_kernel.py), so that parity
checks them and the `sm120` grid times them on a GPU whose `auto` runs another config."""

from __future__ import annotations

import torch

from harness import impl_kernel, registry, sweep

FORCED = {f"verify-attn-cuda-{c}": c for c in impl_kernel.FORCED_CONFIGS}


def test_each_forced_entry_prepares_the_kernel_with_its_config() -> None:
    for name, config in FORCED.items():
        impl = registry.get(name)
        assert impl.prepare.func is impl_kernel.prepare  # type: ignore[attr-defined]
        assert impl.prepare.keywords == {"config": config}  # type: ignore[attr-defined]
        ok, reason = impl.availability(torch.device("cpu"))
        assert not ok and "CUDA" in reason


def test_the_forced_configs_are_configs_the_api_accepts() -> None:
    import kernel

    assert set(impl_kernel.FORCED_CONFIGS) == {"small", "small-m32"}
    for config in impl_kernel.FORCED_CONFIGS:
        assert kernel._config_id(config) > 0


def test_the_sm120_grid_times_both_shapes_on_the_24_target_cases() -> None:
    grid = sweep.load_grid("sm120")
    plan = grid.plan(sweep.registry_names())
    assert {r.impl for case in plan for r in case.runs} == set(FORCED)
    targets = {
        (c.params.prefix_len, c.params.num_heads, c.params.tree_size)
        for c in plan
        if c.params.batch_size == 1 and c.params.prefix_len >= 32768
    }
    assert targets == {
        (p, h, t) for p in (32768, 65536, 131072, 200000) for h in (8, 16, 64) for t in (16, 64)
    }


def test_the_other_grids_do_not_time_the_forced_entries() -> None:
    for name in ("quick", "default", "full"):
        plan = sweep.load_grid(name).plan(sweep.registry_names())
        assert not {r.impl for case in plan for r in case.runs} & set(FORCED), name
