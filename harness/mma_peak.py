"""``python -m harness mma-peak``: mma.sync's own bf16 rate on this GPU, beside its matmul.

sm_120's tile configs (``small``, ``small-m32``) run on ``mma.sync.m16n8k16`` (bf16 in, fp32
accumulate). Whether a box's tensor pipe or the kernels' instruction stream binds them there
starts with this instruction's own rate: ``mma_peak.cu`` (beside this file, no project headers)
issues it from registers on 4, 8 or 16 accumulators a warp (mode 0), and with each pair of B
fragments loaded by ``ldmatrix.x4`` from shared memory (mode 1, as the kernels' K fragments), for
4-16 warps a CTA and one CTA an SM (plus 8 warps, two CTAs an SM). On the H200 it reaches
~640 TFLOP/s, 80-82 % of the board's matmul (``kernel/NOTES.md``, "Measured after v57").

    python -m harness mma-peak [--matmul-tflops X] [--out DIR]

builds the microbenchmark with ``nvcc`` for this GPU's architecture (cached beside the kernel's
builds, keyed by the source, the architecture and the nvcc version), measures the matmul ceiling
as the sweeps do (:func:`harness.roofline.measure_ceilings`) unless ``--matmul-tflops`` gives it,
and writes ``mma-peak.json`` (every run's line, the best, the ceilings, the GPU, the commit) into
``DIR`` (default ``reports/<UTC time>-mma-peak-<gpu>-<sha7>/``). A ``DIR`` that already holds a
run's results or an ``mma-peak.json`` is refused before the build (exit 2), but for a bring-up's
folder, whose rerun replaces the records of the steps it runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import box_record
from harness.cli import positive_number, shown

SOURCE = Path(__file__).with_name("mma_peak.cu")
OUTPUT_FILE = "mma-peak.json"
SCHEMA = "verify-attention/mma-peak"
SCHEMA_VERSION = 1
RUN_TIMEOUT_S = 300
NVCC_TIMEOUT_S = 600
RUN_KEYS = ("mode", "acc", "warps_per_cta", "ctas_per_sm", "ms", "tflops", "of_matmul")


class MmaPeakError(RuntimeError):
    """A build, run or output of the microbenchmark that cannot be used; the message says why."""


def arch_of(capability: tuple[int, int]) -> str:
    """``(12, 0)`` -> ``"120"``: the digits of ``compute_XY`` / ``sm_XY``."""
    major, minor = capability
    if major < 8 or minor < 0:
        raise MmaPeakError(f"compute capability {major}.{minor}: mma.sync bf16 needs 8.0 or newer")
    return f"{major}{minor}"


def find_nvcc() -> str:
    """``nvcc`` on the PATH, else under ``$CUDA_HOME/bin``."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    raise MmaPeakError("nvcc not found: put CUDA's nvcc on the PATH or set CUDA_HOME")


def nvcc_command(nvcc: str, arch: str, output: Path, source: Path = SOURCE) -> list[str]:
    return [
        nvcc,
        "-std=c++17",
        "-O3",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-o",
        str(output),
        str(source),
    ]


def _run(argv: list[str], what: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``argv`` run with its output captured; MmaPeakError, naming ``what``, if it runs past
    ``timeout_s`` (it is killed then)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise MmaPeakError(f"{what} ran past its timeout of {timeout_s:g} s and was stopped") from e


def _nvcc_version(nvcc: str) -> str:
    done = _run([nvcc, "--version"], "nvcc --version", 60)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else "unknown"


def build(arch: str, nvcc: str | None = None) -> Path:
    """The microbenchmark for ``arch``, built once per (source, arch, nvcc version)."""
    from kernel.build import build_dir

    nvcc = nvcc or find_nvcc()
    key = hashlib.sha256(SOURCE.read_bytes() + arch.encode() + _nvcc_version(nvcc).encode()).hexdigest()[:16]
    directory = build_dir(f"mma_peak_{key}")
    binary = directory / "mma_peak"
    if binary.is_file():
        return binary
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".mma_peak.{os.getpid()}.tmp"
    try:
        done = _run(nvcc_command(nvcc, arch, partial), f"nvcc for sm_{arch}", NVCC_TIMEOUT_S)
        if done.returncode != 0:
            raise MmaPeakError(f"nvcc failed for sm_{arch} (exit {done.returncode}):\n{done.stderr.strip()}")
    except BaseException:  # nvcc's error, or Ctrl-C: no partial binary stays behind
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, binary)  # a build cut short never leaves a binary behind
    return binary


def parse_runs(text: str) -> list[dict[str, Any]]:
    """The JSON lines the microbenchmark prints, one per run; other lines are ignored."""
    runs = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            run = json.loads(line)
        except json.JSONDecodeError as e:
            raise MmaPeakError(f"unreadable result line {line!r}: {e}") from e
        missing = [k for k in RUN_KEYS if k not in run]
        if missing:
            raise MmaPeakError(f"result line {line!r} lacks {', '.join(missing)}")
        runs.append({k: run[k] for k in RUN_KEYS})
    if not runs:
        raise MmaPeakError("the microbenchmark printed no result line")
    return runs


def run_benchmark(binary: Path, matmul_tflops: float, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """The microbenchmark's output; MmaPeakError if it fails or runs past ``timeout_s``."""
    done = _run([str(binary), f"{matmul_tflops:.6f}"], "the microbenchmark", timeout_s)
    if done.returncode != 0:
        raise MmaPeakError(f"the microbenchmark exited {done.returncode}:\n{done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Best:
    tflops: float
    of_matmul: float
    run: dict[str, Any]


def best_run(runs: list[dict[str, Any]], mode: int | None = None) -> Best:
    """The fastest run (of one mode, if given)."""
    pool = [r for r in runs if mode is None or r["mode"] == mode]
    if not pool:
        raise MmaPeakError(f"no run of mode {mode}")
    top = max(pool, key=lambda r: r["tflops"])
    return Best(float(top["tflops"]), float(top["of_matmul"]), top)


def main(args: argparse.Namespace) -> int:
    import torch

    if box_record.refused("mma-peak", args.out, OUTPUT_FILE):  # before the build and the run
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    try:
        arch = arch_of((props.major, props.minor))
        binary = build(arch)
    except MmaPeakError as e:
        print(f"error: mma-peak: {e}", file=sys.stderr)
        return 1
    ceilings: dict[str, Any] | None = None
    if args.matmul_tflops is not None:
        matmul, source = args.matmul_tflops, "given (--matmul-tflops)"
    else:
        from harness.roofline import measure_ceilings

        measured = measure_ceilings(device)
        matmul, source = measured.bf16_tflops, "measured"
        ceilings = measured.to_json()
    print(f"mma-peak: sm_{arch} on {props.name}, matmul {matmul:.1f} TFLOP/s ({source})", flush=True)
    try:
        runs = parse_runs(run_benchmark(binary, matmul))
    except MmaPeakError as e:
        print(f"error: mma-peak: {e}", file=sys.stderr)
        return 1
    best = best_run(runs)
    body = {
        "arch": f"sm_{arch}",
        "matmul_tflops": matmul,
        "matmul_source": source,
        "ceilings": ceilings,
        "runs": runs,
        "best": {"tflops": best.tflops, "of_matmul": best.of_matmul, "run": best.run},
        "best_by_mode": {str(m): vars(best_run(runs, m)) for m in sorted({r["mode"] for r in runs})},
    }
    path = box_record.write("mma-peak", args.out, OUTPUT_FILE, (SCHEMA, SCHEMA_VERSION), device, body)
    if path is None:
        return 2
    print(f"{'mode':>4} {'acc':>3} {'warps':>5} {'ctas/SM':>7} {'TFLOP/s':>8} {'of matmul':>9}")
    for r in runs:
        print(
            f"{r['mode']:>4} {r['acc']:>3} {r['warps_per_cta']:>5} {r['ctas_per_sm']:>7} "
            f"{r['tflops']:>8.1f} {r['of_matmul']:>9.3f}"
        )
    print(f"best {best.tflops:.1f} TFLOP/s, {100 * best.of_matmul:.1f} % of the matmul -> {shown(path)}")
    return 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser(
        "mma-peak",
        help="mma.sync's own bf16 rate on this GPU (sm_120's instruction), beside its matmul",
        description=__doc__.split("\n\n", 1)[0],
    )
    p.add_argument(
        "--matmul-tflops",
        type=positive_number("TFLOP/s"),
        metavar="X",
        help="the board's bf16 matmul TFLOP/s for the 'of matmul' column (default: measure it)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="folder for mma-peak.json (default: reports/<time>-mma-peak-<gpu>-<sha7>)",
    )
    p.set_defaults(func=main)
