"""The sm_90a/sm_120 resource gate (kernel/ptxas_check.py) parses ptxas's report and can fail."""

from __future__ import annotations

import pytest

from kernel.ptxas_check import ARCHS, MAIN_KERNEL, check, define_flags, parse_ptxas

CONFIGS = {
    "large": {"rows_per_cta": 64, "block_n": 32, "stages": 2, "threads": 256, "dynamic_smem_bytes": 165888},
    "small": {"rows_per_cta": 48, "block_n": 16, "stages": 2, "threads": 192, "dynamic_smem_bytes": 99584},
    "small-m32": {
        "rows_per_cta": 32,
        "block_n": 16,
        "stages": 3,
        "threads": 128,
        "dynamic_smem_bytes": 97536,
    },
    "wgmma": {"rows_per_cta": 64, "block_n": 64, "stages": 2, "threads": 256, "dynamic_smem_bytes": 230912},
    "wgmma-ws": {
        "rows_per_cta": 64,
        "block_n": 48,
        "stages": 3,
        "threads": 384,
        "dynamic_smem_bytes": 185344,
    },
    "wgmma-ws-pipe": {
        "rows_per_cta": 64,
        "block_n": 48,
        "stages": 3,
        "threads": 384,
        "dynamic_smem_bytes": 218112,
    },
}
# Each config's main kernel as ptxas names it (the template arguments as nvcc mangles them).
MANGLED = {
    "large": ("verify_attention_kernel", "6ConfigILi4ELi32ELi2EEE"),
    "small": ("verify_attention_kernel", "6ConfigILi3ELi32ELi2ELi1ELi4EEE"),
    "small-m32": ("verify_attention_kernel", "6ConfigILi2ELi32ELi2ELi1ELi4EEE"),
    "wgmma": ("verify_attention_wgmma_kernel", "11ConfigWgmmaEE"),
    "wgmma-ws": ("verify_attention_wgmma_ws_kernel", "14ConfigWgmmaWsTILi48ELi3ELb0EEEE"),
    "wgmma-ws-pipe": ("verify_attention_wgmma_ws_kernel", "14ConfigWgmmaWsTILi48ELi3ELb1EEEE"),
}


def report(regs: int = 168, spill: int = 0, stack: int = 0, static_smem: int = 0) -> str:
    lines = []
    for arch in ARCHS:
        for name, args in MANGLED.values():
            fn = f"_ZN2va{len(name)}{name}INS_{args}EvNS_6ParamsE"
            lines += [
                f"ptxas info    : Compiling entry function '{fn}' for '{arch}'",
                f"ptxas info    : Function properties for {fn}",
                f"    {stack} bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads",
                f"ptxas info    : Used {regs} registers, used 1 barriers"
                + (f", {static_smem} bytes smem" if static_smem else ""),
            ]
    return "\n".join(lines)


def test_a_clean_report_passes() -> None:
    assert set(MANGLED) == set(MAIN_KERNEL)
    kernels = parse_ptxas(report())
    assert len(kernels) == len(ARCHS) * len(MAIN_KERNEL)
    assert check(kernels, CONFIGS) == []


def test_each_config_finds_its_own_kernel() -> None:
    """The two wgmma-ws configs differ only in a bool template argument: each must match its own
    kernel, so that a spill in one is charged to it and a missing one is reported."""
    kernels = [k for k in parse_ptxas(report()) if not ("Lb1E" in k.function and k.arch == "sm_90a")]
    assert check(kernels, CONFIGS) == [
        "sm_90a: no main kernel found for config 'wgmma-ws-pipe' in the ptxas report"
    ]


def test_spills_fail() -> None:
    problems = check(parse_ptxas(report(spill=16)), CONFIGS)
    assert problems and all("spills 16 B" in p for p in problems)


def test_a_stack_frame_fails() -> None:
    assert any("stack frame" in p for p in check(parse_ptxas(report(stack=32)), CONFIGS))


def test_shared_memory_over_the_sm120_limit_fails() -> None:
    # 99584 B dynamic + 8 KB static exceeds sm_120's 99 KB opt-in limit for the config it picks there
    problems = check(parse_ptxas(report(static_smem=8192)), CONFIGS)
    assert any(p.startswith("sm_120: config 'small'") for p in problems)


def test_shared_memory_of_the_per_call_shape_is_checked_too() -> None:
    """small-m32, which `auto` takes per call on sm_120, must fit there like small."""
    configs = {**CONFIGS, "small-m32": {**CONFIGS["small-m32"], "dynamic_smem_bytes": 100 * 1024}}
    problems = check(parse_ptxas(report()), configs)
    assert problems == [
        f"sm_120: config 'small-m32' (chosen there at run time) needs {100 * 1024} B shared memory (limit {99 * 1024})"
    ]


def test_registers_beyond_the_register_file_fail() -> None:
    # 384 threads (the wgmma-ws configs) x 168 registers fit the 64K register file; x 176 do not
    assert check(parse_ptxas(report(regs=168)), CONFIGS) == []
    problems = check(parse_ptxas(report(regs=176)), CONFIGS)
    assert problems == [
        "sm_90a: config 'wgmma-ws' needs 176 x 384 registers (limit 65536)",
        "sm_90a: config 'wgmma-ws-pipe' needs 176 x 384 registers (limit 65536)",
    ]


def test_shared_memory_of_the_pipelined_config_is_checked_on_sm90a() -> None:
    """wgmma-ws-pipe, which `auto` takes per call on sm_90a, must fit its 227 KB like wgmma-ws."""
    configs = {**CONFIGS, "wgmma-ws-pipe": {**CONFIGS["wgmma-ws-pipe"], "dynamic_smem_bytes": 228 * 1024}}
    assert check(parse_ptxas(report()), configs) == [
        f"sm_90a: config 'wgmma-ws-pipe' (chosen there at run time) needs {228 * 1024} B shared memory "
        f"(limit {227 * 1024})"
    ]


def test_a_missing_kernel_is_reported() -> None:
    assert any("no main kernel found" in p for p in check([], CONFIGS))


def test_define_takes_the_kernels_build_switches_only() -> None:
    assert define_flags(["VA_Q_NARROW_LOADS", "VA_WS_BLOCK_N=32"]) == [
        "-DVA_Q_NARROW_LOADS",
        "-DVA_WS_BLOCK_N=32",
    ]
    assert define_flags([]) == []
    with pytest.raises(ValueError, match="--define: expected a build switch"):
        define_flags(["-DVA_WS_BLOCK_N=32"])
    with pytest.raises(ValueError, match="'VA_WS_NO_SUCH' is not a build switch"):
        define_flags(["VA_WS_NO_SUCH=1"])
    with pytest.raises(ValueError, match="'VA_HAVE_SM90A' is not a build switch"):
        define_flags(["VA_HAVE_SM90A"])  # set per arch by the build itself
