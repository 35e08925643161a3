"""Workload for tests/test_combine_plan.py (not collected by pytest), run in a process of its own
on a build with `VA_CHECK_COMBINE_PLAN`, where the few-row combine writes NaN into every row whose
plan entries (its request's split count and first partial slot), derived from the inputs before
its griddepcontrol.wait, differ from the ones the main kernel published (kernel/NOTES.md v79).

Per config and SM count the GPU runs ragged few-row batches (at most 512 rows, the calls
`combine_wide_kernel` merges) of 1-32 requests, where the combine derives the entries, and of 33-40,
where it reads the published ones. Each call's outputs are filled with NaN first and checked
against the fp64 oracle, so a derived entry that differs, or a wrong merge, fails the call.
Prints one line per wrong call and a summary line with the count.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_kernel_gpu import assert_close, describe, gpu_configs, make_batch, run_kernel  # noqa: E402

MAX_ROWS = 512  # the few-row combine's bound (kCombineManySplitsRows in verify_attention.cu)
SM_COUNTS = (None, 16, 84, 100, 188)  # None: this GPU's own
CASES_PER_SM_COUNT = 6


def few_row_shape(rng: random.Random) -> tuple[list[int], list[int], int]:
    """(prefix lens, draft counts, heads) of a ragged batch of at most MAX_ROWS rows."""
    while True:
        b = rng.choice((1, 1, 2, 3, 5, 8, 16, 31, 32, 33, 40))
        h = rng.choice((1, 2, 8, 16))
        num_draft = [rng.choice((1, 2, 4, 7, 16, 33, 64)) for _ in range(b)]
        if sum(num_draft) * h > MAX_ROWS:
            continue
        prefix = [rng.choice((0, 1, 47, 900, 4000, 20000, 40000)) for _ in range(b)]
        return prefix, num_draft, h


def main() -> int:
    cuda = torch.device("cuda")
    rng = random.Random(79)
    wrong = calls = 0
    configs = gpu_configs()
    for config in configs:
        for num_sms in SM_COUNTS:
            for _ in range(CASES_PER_SM_COUNT):
                batch = make_batch(rng, cuda, *few_row_shape(rng))
                n, h = batch.q.shape[0], batch.q.shape[1]
                out = torch.full((n, h, 512), float("nan"), dtype=torch.bfloat16, device=cuda)
                lse = torch.full((n, h), float("nan"), dtype=torch.float32, device=cuda)
                run_kernel(batch, config, num_sms=num_sms, out=out, lse=lse)
                calls += 1
                try:
                    assert_close(out, lse, batch, f"{describe(batch)} config={config} num_sms={num_sms}")
                except AssertionError as e:
                    wrong += 1
                    print(f"FAIL {str(e).splitlines()[0]}", flush=True)
    print(f"combine plan workload done: {', '.join(configs)}; {calls} calls; {wrong} calls wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
