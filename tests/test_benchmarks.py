"""pytest-benchmark over the ``quick`` grid's kernel cases, timed on the GPU.

Run on a GPU box (every test here is ``gpu``-marked and skips elsewhere)::

    pytest -m gpu tests/test_benchmarks.py --benchmark-autosave     # store the run in .benchmarks/
    pytest -m gpu tests/test_benchmarks.py --benchmark-compare      # table against the last stored run
    pytest -m gpu tests/test_benchmarks.py --benchmark-compare=0001 --benchmark-compare-fail=median:10%

Clock: each round's setup (not timed) flushes L2 as the sweep does and synchronises; the timed
target runs the kernel once and synchronises. pytest-benchmark's host clock therefore reads the
GPU time of one call from an idle, cold GPU plus a launch and a synchronisation (microseconds,
the same in every run), so stored runs compare like with like. Absolute device times come from
the sweep (``python -m harness sweep``), which brackets calls with CUDA events.
"""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.cases import build_batch
from harness.sweep import load_grid
from harness.timing import FLUSH_FACTOR, L2Flush, l2_bytes_of

KERNEL = "verify-attn-cuda"
PLAN = [(c.params, r.timing) for c in load_grid("quick").plan([KERNEL]) for r in c.runs]

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


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

    def setup() -> None:
        flush()
        torch.cuda.synchronize(device)

    def target() -> None:
        run()
        torch.cuda.synchronize(device)

    benchmark.group = f"H{params.num_heads}-T{params.tree_size}"
    benchmark.extra_info.update(
        params.to_json(), case_id=params.case_id, bytes=batch.min_bytes(), flops=batch.flops()
    )
    benchmark.pedantic(target, setup=setup, rounds=timing.max_samples, warmup_rounds=timing.warmup)
