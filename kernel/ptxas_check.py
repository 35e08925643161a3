"""Compile the kernels for every target arch with nvcc (no GPU needed) and check their resources.

    python -m kernel.ptxas_check [--json out.json] [--define VA_SWITCH=VALUE ...]

For each arch (sm_90a, i.e. sm_90 with the wgmma kernel, and sm_120) it reads ptxas's resource
report and fails when:
  * any kernel spills (spill stores/loads) or uses a stack frame (local memory in the hot loop);
  * a main-kernel configuration cannot launch there: registers x threads over the 64K register
    file, or (for the configuration picked there at run time) dynamic + static shared memory over
    the arch's per-block limit;
  * the configuration the kernel picks at run time (wgmma-ws on sm_90a, and wgmma-ws-pipe per call;
    on sm_120 by its 99 KB opt-in limit: small, and small-m32 per call) is not the one expected
    there.
On sm_120 the wgmma kernel is compiled as a stub that traps (wgmma exists only on sm_90a), so
only the mma.sync configurations are checked there.
Dynamic shared memory comes from the configurations themselves (a host program built from the
same header prints them), so the check cannot drift from the code. `--define` builds the kernels
and that program with one of the kernel's build switches set (README, "Build switches"), e.g.
`--define VA_WS_BLOCK_N=32`, so that a switch's build is held to the same limits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"

# Per-block shared-memory opt-in limits (CUDA C Programming Guide, "Technical Specifications per
# Compute Capability"): 227 KB on sm_90, 99 KB on sm_120 (and sm_86/sm_89).
ARCHS = {"sm_90a": 227 * 1024, "sm_120": 99 * 1024}
REGISTER_FILE = 64 * 1024
# The config the kernel chooses per arch (make_plan: wgmma-ws on sm_90a, else large if it fits the
# opt-in limit, else small), and the ones it picks per call beside it (wgmma-ws-pipe from 256 rows
# a request on sm_90a, small-m32 for few rows on sm_120): their shared memory must fit too.
EXPECTED_CONFIG = {"sm_90a": "wgmma-ws", "sm_120": "small"}
ALSO_CHOSEN = {"sm_90a": ("wgmma-ws-pipe",), "sm_120": ("small-m32",)}
# Configs that can run on each arch (and so must compile cleanly and fit there).
ARCH_CONFIGS = {
    "sm_90a": ("wgmma-ws", "wgmma-ws-pipe", "wgmma", "large", "small", "small-m32"),
    "sm_120": ("large", "small", "small-m32"),
}
# Each config's main kernel: (kernel name, a regular expression for its template arguments) as they
# appear mangled (a bool template argument reads Lb0E / Lb1E).
MAIN_KERNEL = {
    "large": ("verify_attention_kernel", "ConfigILi4ELi32ELi2E"),
    "small": ("verify_attention_kernel", "ConfigILi3ELi32ELi2ELi1ELi4E"),
    "small-m32": ("verify_attention_kernel", "ConfigILi2ELi32ELi2ELi1ELi4E"),
    "wgmma": ("verify_attention_wgmma_kernel", "ConfigWgmmaE"),
    "wgmma-ws": ("verify_attention_wgmma_ws_kernel", r"ConfigWgmmaWsTILi\d+ELi\d+ELb0E"),
    "wgmma-ws-pipe": ("verify_attention_wgmma_ws_kernel", r"ConfigWgmmaWsTILi\d+ELi\d+ELb1E"),
}


@dataclass(frozen=True)
class KernelResources:
    arch: str
    function: str
    registers: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    static_smem_bytes: int


_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(report: str) -> list[KernelResources]:
    """Parse ``nvcc -Xptxas -v`` output into one record per entry function."""
    out: list[KernelResources] = []
    current: dict[str, object] | None = None
    for line in report.splitlines():
        if m := _ENTRY.search(line):
            current = {"function": m.group(1), "arch": m.group(2)}
        elif current is not None and (m := _FRAME.search(line)):
            current.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        elif current is not None and (m := _USED.search(line)):
            out.append(
                KernelResources(
                    arch=str(current["arch"]),
                    function=str(current["function"]),
                    registers=int(m.group(1)),
                    stack_frame_bytes=int(current.get("stack", 0)),
                    spill_store_bytes=int(current.get("spill_st", 0)),
                    spill_load_bytes=int(current.get("spill_ld", 0)),
                    static_smem_bytes=int(m.group(2) or 0),
                )
            )
            current = None
    return out


_DEFINE = re.compile(r"VA_[A-Z0-9_]+(=[A-Za-z0-9_]+)?")


def source_switches() -> set[str]:
    """The VA_ macros the kernel sources test in #if / #ifdef / #ifndef / #elif lines."""
    found: set[str] = set()
    for path in CSRC.iterdir():
        for line in path.read_text().splitlines():
            if m := re.match(r"\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)", line):
                found |= set(re.findall(r"\bVA_[A-Z0-9_]+", m.group(1)))
    return found - {"VA_HAVE_SM90A"}  # set per arch by the build itself


def define_flags(defines: list[str]) -> list[str]:
    """``-D`` flags for the kernel's build switches; a clear error for anything else."""
    switches = source_switches() if defines else set()
    for d in defines:
        if not _DEFINE.fullmatch(d):
            raise ValueError(f"--define: expected a build switch as VA_NAME or VA_NAME=VALUE, got {d!r}")
        if d.split("=")[0] not in switches:
            raise ValueError(
                f"--define: {d.split('=')[0]!r} is not a build switch the kernel sources read "
                f"(README, 'Build switches': {', '.join(sorted(switches))})"
            )
    return [f"-D{d}" for d in defines]


def compile_report(arch: str, workdir: Path, switch_flags: list[str] = ()) -> str:
    """nvcc's resource report for ``arch``; ``switch_flags`` from :func:`define_flags`."""
    num = arch.split("_")[1]
    flags = (["-DVA_HAVE_SM90A"] if arch == "sm_90a" else []) + list(switch_flags)
    cmd = [
        "nvcc", "-std=c++17", "-O3", "--use_fast_math", f"-gencode=arch=compute_{num},code={arch}", *flags,
        "-Xptxas", "-v", "-cubin", "-o", str(workdir / f"va_{arch}.cubin"), str(CSRC / "verify_attention.cu"),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {arch}:\n{res.stdout}\n{res.stderr}")
    return res.stdout + res.stderr


def build_config_report(workdir: Path, switch_flags: list[str] = ()) -> Path:
    """The host program that prints the configurations (and `auto`'s small-shape rule)."""
    exe = workdir / "config_report"
    cmd = ["nvcc", "-std=c++17", *switch_flags, "-o", str(exe), str(CSRC / "config_report.cu")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for config_report.cu:\n{res.stdout}\n{res.stderr}")
    return exe


def config_sizes(workdir: Path, switch_flags: list[str] = ()) -> dict[str, dict[str, int]]:
    exe = build_config_report(workdir, switch_flags)
    return json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


def check(kernels: list[KernelResources], configs: dict[str, dict[str, int]]) -> list[str]:
    """Human-readable problems; empty when everything fits."""
    problems = []
    for k in kernels:
        if k.spill_store_bytes or k.spill_load_bytes:
            problems.append(
                f"{k.arch} {k.function}: spills {k.spill_store_bytes} B stores / {k.spill_load_bytes} B loads"
            )
        if k.stack_frame_bytes:
            problems.append(f"{k.arch} {k.function}: {k.stack_frame_bytes} B stack frame (local memory)")
    for arch, limit in ARCHS.items():
        for name in ARCH_CONFIGS[arch]:
            cfg = configs[name]
            kernel_name, tag = MAIN_KERNEL[name]
            main = [k for k in kernels if k.arch == arch and f"va{len(kernel_name)}{kernel_name}" in k.function
                    and re.search(tag, k.function)]  # fmt: skip
            if not main:
                problems.append(f"{arch}: no main kernel found for config {name!r} in the ptxas report")
                continue
            k = main[0]
            smem = cfg["dynamic_smem_bytes"] + k.static_smem_bytes
            # Registers over the file: the config cannot launch at all. Shared memory over the
            # limit: the launcher refuses it with a clear error, fine except for the config the
            # arch picks at run time.
            if k.registers * cfg["threads"] > REGISTER_FILE:
                problems.append(
                    f"{arch}: config {name!r} needs {k.registers} x {cfg['threads']} registers "
                    f"(limit {REGISTER_FILE})"
                )
            if (name == EXPECTED_CONFIG[arch] or name in ALSO_CHOSEN[arch]) and smem > limit:
                problems.append(
                    f"{arch}: config {name!r} (chosen there at run time) needs {smem} B shared memory "
                    f"(limit {limit})"
                )
        chosen = next((n for n in ("wgmma-ws", "large", "small") if n in ARCH_CONFIGS[arch]
                       and configs[n]["dynamic_smem_bytes"] <= limit), None)  # fmt: skip
        if chosen != EXPECTED_CONFIG[arch]:
            problems.append(
                f"{arch}: the run-time choice would be {chosen!r}, expected {EXPECTED_CONFIG[arch]!r}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the resource report here")
    parser.add_argument(
        "--define", action="append", default=[], metavar="VA_SWITCH=VALUE",
        help="build with this kernel build switch set (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        switch_flags = define_flags(args.define)  # checked once, used by every build below
    except ValueError as e:
        parser.error(str(e))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        kernels = [k for arch in ARCHS for k in parse_ptxas(compile_report(arch, work, switch_flags))]
        configs = config_sizes(work, switch_flags)
    print(f"{'arch':7} {'regs':>4} {'stack':>5} {'spill':>5} {'smem':>5}  function")
    for k in kernels:
        spill = k.spill_store_bytes + k.spill_load_bytes
        print(
            f"{k.arch:7} {k.registers:4d} {k.stack_frame_bytes:5d} {spill:5d} {k.static_smem_bytes:5d}  {k.function}"
        )
    for name, cfg in configs.items():
        print(f"config {name}: {cfg}")
    problems = check(kernels, configs)
    if args.json:
        report = json.dumps(
            {"kernels": [asdict(k) for k in kernels], "configs": configs, "problems": problems}, indent=1
        )
        partial = args.json.with_name(f".{args.json.name}.{os.getpid()}.tmp")
        try:  # whole or not at all: a CI step may read it after a cut-short run
            partial.write_text(report)
            os.replace(partial, args.json)
        finally:
            partial.unlink(missing_ok=True)
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    print(
        "ptxas check" + "".join(f" -D{d}" for d in args.define) + ":",
        "FAILED" if problems else "ok (no spills, no stack frame, shared memory within limits)",
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
