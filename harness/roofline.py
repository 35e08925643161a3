"""Roofline: the box's measured ceilings and each case's floor (DESIGN.md section 5).

Ceilings are measured in the same run as the cases they judge, with the same clock
(:func:`harness.timing.measure`, median of the samples):

* copy bandwidth: a device-to-device copy of ``copy_bytes`` (4 GiB by default, so 8 GiB of
  traffic); bandwidth = (bytes read + bytes written) / time;
* bf16 tensor peak: an ``n x n x n`` bf16 matmul (n = 8192 by default) on random normal data.
  Zeros would be faster than real data: the power a tensor core draws depends on the bits it
  multiplies, and a power-capped GPU clocks down on real data.
* the timing's own floor: an empty kernel (a one-element add) timed the same way, between the
  same two events after the same cold-L2 step. It is shown beside the ceilings and enters no
  floor: it says how much of a short call's time is launch and events on this box and driver.

Per case, ``floor_ms = max(min_bytes / bandwidth, flops / peak)`` with the bytes and FLOPs of
:class:`harness.batch.VerifyBatch`; the report shows GB/s, TFLOP/s and the percentage of the
floor reached, ``100 * floor_ms / median_ms`` (100 % = at the roofline).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from harness.timing import Timing, measure

COPY_BYTES = 4 * 1024**3
MATMUL_N = 8192
# Never take more than this share of free device memory for the copy's two buffers.
COPY_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class Ceilings:
    copy_bandwidth_gbs: float
    bf16_tflops: float
    method: str
    copy_bytes: int
    matmul_n: int
    copy_median_ms: float
    matmul_median_ms: float
    empty_kernel_ms: float = 0.0  # 0: not measured (runs before it was)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Ceilings:
        missing = [k for k in ("copy_bandwidth_gbs", "bf16_tflops") if k not in d]
        if missing:
            raise ValueError(f"ceilings: missing {', '.join(missing)} in {sorted(d)}")
        return cls(
            copy_bandwidth_gbs=float(d["copy_bandwidth_gbs"]),
            bf16_tflops=float(d["bf16_tflops"]),
            method=str(d.get("method", "")),
            copy_bytes=int(d.get("copy_bytes", 0)),
            matmul_n=int(d.get("matmul_n", 0)),
            copy_median_ms=float(d.get("copy_median_ms", 0.0)),
            matmul_median_ms=float(d.get("matmul_median_ms", 0.0)),
            empty_kernel_ms=float(d.get("empty_kernel_ms", 0.0)),
        )


@dataclass(frozen=True)
class Throughput:
    bandwidth_gbs: float
    tflops: float
    floor_ms: float | None
    pct_of_floor: float | None  # 100 * floor / median


def _time_copy(device: torch.device, copy_bytes: int, gen: torch.Generator) -> Timing:
    # buffers live only in this frame, so they are freed before the matmul allocates
    src = torch.empty(copy_bytes // 4, dtype=torch.int32, device=device).random_(generator=gen)
    dst = torch.empty_like(src)
    return measure(lambda: dst.copy_(src), min_samples=10, max_samples=50, max_time_s=1.0, device=device)


def _time_matmul(device: torch.device, n: int, gen: torch.Generator) -> Timing:
    a = torch.randn(n, n, generator=gen, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, generator=gen, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    return measure(
        lambda: torch.mm(a, b, out=out), min_samples=10, max_samples=50, max_time_s=1.0, device=device
    )


def _time_empty_kernel(device: torch.device) -> Timing:
    x = torch.zeros(1, device=device)
    return measure(lambda: x.add_(1), min_samples=20, max_samples=100, max_time_s=0.5, device=device)


def measure_ceilings(
    device: torch.device | str = "cuda", *, copy_bytes: int = COPY_BYTES, matmul_n: int = MATMUL_N
) -> Ceilings:
    """Measure copy bandwidth and bf16 matmul throughput on ``device``, and the timing's floor."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        copy_bytes = min(copy_bytes, int(free * COPY_MEMORY_SHARE) // 2)
    copy_bytes -= copy_bytes % 16
    if copy_bytes <= 0 or matmul_n <= 0:
        raise ValueError(
            f"measure_ceilings: copy_bytes={copy_bytes} and matmul_n={matmul_n} must be positive"
        )
    gen = torch.Generator(device=device).manual_seed(0)
    copy = _time_copy(device, copy_bytes, gen)
    mm = _time_matmul(device, matmul_n, gen)
    empty = _time_empty_kernel(device)
    return Ceilings(
        copy_bandwidth_gbs=2 * copy_bytes / (copy.median_ms * 1e-3) / 1e9,
        bf16_tflops=2 * matmul_n**3 / (mm.median_ms * 1e-3) / 1e12,
        method=(
            f"median of {copy.stats.n} device-to-device copies of {copy_bytes / 2**30:.2f} GiB "
            f"(read + write counted) and of {mm.stats.n} {matmul_n}^3 bf16 matmuls on random "
            f"normal data, cold L2 ({copy.cold_l2}); the timing's floor: the median of "
            f"{empty.stats.n} empty kernels (a one-element add) between the same events"
        ),
        copy_bytes=copy_bytes,
        matmul_n=matmul_n,
        copy_median_ms=copy.median_ms,
        matmul_median_ms=mm.median_ms,
        empty_kernel_ms=empty.median_ms,
    )


def floor_ms(num_bytes: int, flops: int, ceilings: Ceilings) -> float:
    """The roofline time: the slower of moving ``num_bytes`` and computing ``flops``."""
    return max(num_bytes / (ceilings.copy_bandwidth_gbs * 1e9), flops / (ceilings.bf16_tflops * 1e12)) * 1e3


def throughput(num_bytes: int, flops: int, median_ms: float, ceilings: Ceilings | None) -> Throughput:
    """GB/s and TFLOP/s achieved in ``median_ms``, and the floor and % of it when ceilings exist."""
    if median_ms <= 0:
        raise ValueError(f"throughput: median_ms must be positive, got {median_ms}")
    seconds = median_ms * 1e-3
    floor = floor_ms(num_bytes, flops, ceilings) if ceilings is not None else None
    return Throughput(
        bandwidth_gbs=num_bytes / seconds / 1e9,
        tflops=flops / seconds / 1e12,
        floor_ms=floor,
        pct_of_floor=100.0 * floor / median_ms if floor is not None else None,
    )
