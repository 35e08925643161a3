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
        "block_n": 32,
        "stages": 5,
        "threads": 384,
        "dynamic_smem_bytes": 203520,
    },
}


def report(regs: int = 168, spill: int = 0, stack: int = 0, static_smem: int = 0) -> str:
    lines = []
    for arch in ARCHS:
        for name, tag in MAIN_KERNEL.values():
            fn = f"_ZN2va{len(name)}{name}INS_6{tag}EEEvNS_6ParamsE"
            lines += [
                f"ptxas info    : Compiling entry function '{fn}' for '{arch}'",
                f"ptxas info    : Function properties for {fn}",
                f"    {stack} bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads",
                f"ptxas info    : Used {regs} registers, used 1 barriers"
                + (f", {static_smem} bytes smem" if static_smem else ""),
            ]
    return "\n".join(lines)


def test_a_clean_report_passes() -> None:
    kernels = parse_ptxas(report())
    assert len(kernels) == len(ARCHS) * len(MAIN_KERNEL)
    assert check(kernels, CONFIGS) == []


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
    # 384 threads (wgmma-ws) x 168 registers fit the 64K register file; x 176 do not
    assert check(parse_ptxas(report(regs=168)), CONFIGS) == []
    problems = check(parse_ptxas(report(regs=176)), CONFIGS)
    assert problems and all("'wgmma-ws' needs 176 x 384 registers" in p for p in problems)


def test_a_missing_kernel_is_reported() -> None:
    assert any("no main kernel found" in p for p in check([], CONFIGS))


def test_define_takes_the_kernels_build_switches_only() -> None:
    assert define_flags(["VA_WS_PIPE_QK=1", "VA_WS_BLOCK_N=32"]) == [
        "-DVA_WS_PIPE_QK=1",
        "-DVA_WS_BLOCK_N=32",
    ]
    assert define_flags([]) == []
    with pytest.raises(ValueError, match="--define: expected a build switch"):
        define_flags(["-DVA_WS_PIPE_QK=1"])
    with pytest.raises(ValueError, match="'VA_WS_NO_SUCH' is not a build switch"):
        define_flags(["VA_WS_NO_SUCH=1"])
    with pytest.raises(ValueError, match="'VA_HAVE_SM90A' is not a build switch"):
        define_flags(["VA_HAVE_SM90A"])  # set per arch by the build itself
