"""Workload for tests/test_plan_order.py (not collected by pytest), run in a process of its own on
a build with `VA_DELAY_PLAN_PUBLISH_NS`, where each main kernel's CTA 0 publishes the plan's
entries (each request's split count and first partial slot) late.

The few-row combine reads those entries before its griddepcontrol.wait, so the main kernel's CTA
0 must let it launch only after writing them. Per config the GPU runs: a batch whose requests
split (40 requests of one draft token and 8 heads, P=1000: 320 rows, the few-row combine, two
splits a request when laid out for 100 SMs) and one whose requests do not (P=0), alternately,
each call's outputs filled with NaN first and checked against the fp64 oracle. A combine let in
before the entries are written reads the previous call's (the workspace is the same block of the
allocator's): it merges the other batch's partials into rows this call wrote directly, or leaves
this call's split rows unmerged (NaN).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_kernel_gpu import assert_close, describe, gpu_configs, make_batch, run_kernel  # noqa: E402

REQUESTS, HEADS, SPLIT_PREFIX, NUM_SMS = 40, 8, 1000, 100


def main() -> int:
    cuda = torch.device("cuda")
    rng = random.Random(41)
    split = make_batch(rng, cuda, [SPLIT_PREFIX] * REQUESTS, [1] * REQUESTS, HEADS)
    unsplit = make_batch(rng, cuda, [0] * REQUESTS, [1] * REQUESTS, HEADS)
    failures = 0
    configs = gpu_configs()
    for config in configs:
        # The four calls back to back (nothing else takes a large block between them, so each
        # call's workspace is the block the one before it used), then the checks.
        calls = []
        for batch in (split, unsplit, split, unsplit):
            n, h = batch.q.shape[0], batch.q.shape[1]
            out = torch.full((n, h, 512), float("nan"), dtype=torch.bfloat16, device=cuda)
            lse = torch.full((n, h), float("nan"), dtype=torch.float32, device=cuda)
            run_kernel(batch, config, num_sms=NUM_SMS, out=out, lse=lse)
            calls.append((batch, out, lse))
        torch.cuda.synchronize()
        for i, (batch, out, lse) in enumerate(calls):
            try:
                assert_close(out, lse, batch, f"call {i} {describe(batch)} config={config} num_sms={NUM_SMS}")
            except AssertionError as e:
                failures += 1
                print(f"FAIL {str(e).splitlines()[0]}", flush=True)
    print(f"plan order workload done: {', '.join(configs)}; {failures} calls wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
