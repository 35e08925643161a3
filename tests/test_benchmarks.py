"""pytest-benchmark over the ``quick`` grid's kernel cases, timed on the GPU.

Run on a GPU box (every test here is ``gpu``-marked and skips elsewhere)::

    pytest -m gpu tests/test_benchmarks.py --benchmark-autosave     # store the run in .benchmarks/
    pytest -m gpu tests/test_benchmarks.py --benchmark-compare      # table against the last stored run
    pytest -m gpu tests/test_benchmarks.py --benchmark-compare=0001 --benchmark-compare-fail=median:10%

Clock: GPU time, as the sweep takes it (DESIGN.md section 5). Each round's setup (not timed)
enqueues a spin sized from the call's host time and the L2 flush, without waiting; the timed
target enqueues one call between two CUDA events (``harness.timing.EventClock``, the benchmark's
timer), so a stored time is the call's GPU time from a cold L2, without the launch or a
synchronisation. The tests hold the GPU lock the sweep and parity take, so a benchmark never shares
the GPU with them.

Its medians are for comparing one box's benchmark runs with each other, not with the sweep's rows:
every round here flushes L2 where the sweep rotates input sets (how far apart they read:
kernel/NOTES.md, "pytest-benchmark against the sweep, separated").
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from harness import registry
from harness.cases import build_batch
from harness.sweep import load_grid
from harness.timing import (
    FLUSH_FACTOR,
    EventClock,
    L2Flush,
    exclusive_gpu,
    l2_bytes_of,
    spin_cycles_per_ms,
    spin_ms,
)

KERNEL = "verify-attn-cuda"
PLAN = [(c.params, r.timing) for c in load_grid("quick").plan([KERNEL]) for r in c.runs]
CLOCK = EventClock()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.benchmark(timer=CLOCK),
]


@pytest.fixture(scope="module", autouse=True)
def _gpu_lock():
    with exclusive_gpu():
        yield


@pytest.fixture(autouse=True)
def _clock_at_a_start():
    CLOCK.reset()  # a case that failed between start and stop leaves no half pair behind


@pytest.mark.parametrize(("params", "timing"), PLAN, ids=[p.case_id for p, _ in PLAN])
def test_kernel_latency(benchmark, params, timing) -> None:
    device = torch.device("cuda")
    impl = registry.get(KERNEL)
    ok, reason = impl.availability(device)
    if not ok:
        pytest.skip(f"{KERNEL} unavailable: {reason}")
    batch = build_batch(params, device)
    run = impl.prepare(batch)
    out, _ = run()
    assert bool(torch.isfinite(out).all()), f"{params.case_id}: the kernel's output has NaN or Inf"
    flush = L2Flush(device, int(FLUSH_FACTOR * l2_bytes_of(device)))
    host_ms = []
    for _ in range(5):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        host_ms.append((time.perf_counter() - t0) * 1000.0)
    torch.cuda.synchronize(device)
    spin = int(spin_ms(host_ms) * spin_cycles_per_ms(torch.cuda.current_device()))

    def setup() -> None:
        # The GPU busy with the spin and the flush while the host records the start event and
        # enqueues the call: the events then bracket the call alone.
        torch.cuda._sleep(spin)
        flush()

    benchmark.group = f"H{params.num_heads}-T{params.tree_size}"
    benchmark.extra_info.update(
        params.to_json(),
        case_id=params.case_id,
        bytes=batch.min_bytes(),
        flops=batch.flops(),
        clock="cuda events (harness.timing.EventClock)",
        host_ms_per_call=round(statistics.median(host_ms), 4),
    )
    benchmark.pedantic(run, setup=setup, rounds=timing.max_samples, warmup_rounds=timing.warmup)
