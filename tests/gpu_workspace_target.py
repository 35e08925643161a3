"""Workload for tests/test_combine_workspace.py (not collected by pytest), run in a process of its
own, on the default build or on one with `VA_MUTATE_COMBINE_EXTRA_SPLIT`.

The few-row combine must read only the partial slots this call's main kernel wrote: the others
hold whatever the allocator's block held (kernel/NOTES.md, v80-v81, tried reading past them and
dropping what they read). Here each call's workspace is a block that held NaN, or zeros, just
before (the caching allocator hands the freed block back); a row that let an unwritten slot in
reads NaN, or an lse of 0, and differs from the same call on the zeroed block. Per config: single
requests of few and of many splits, an unsplit request 0 in a batch, and batches, each laid out
for this GPU's SM count and for two others. Each call on the NaN block must equal, to the bit,
the call on the zeroed block, and the latter must pass the fp64 oracle; a call that does not
counts as wrong."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_kernel_gpu import assert_close, describe, gpu_configs, make_batch, run_kernel  # noqa: E402

# (prefixes, draft counts, heads): rows of request 0 stay <= 512 a call (the few-row combine).
CASES = (
    ([1000], [16], 8),  # few splits (a split holds >= 128 keys)
    ([32768], [16], 8),  # one request over every SM (66 splits a row tile on 132 SMs)
    ([5000], [7], 16),  # 112 rows, two row tiles
    ([65543], [4], 16),  # one row tile
    ([3, 20000, 40000], [16, 16, 16], 8),  # request 0 unsplit, the others split
    ([3000, 32768, 100, 9000], [16, 16, 16, 16], 8),  # 512 rows
)
SM_COUNTS = (None, 188, 84)  # this GPU's, the RTX PRO 6000's, a small part's
POOL_BYTES = 256 << 20  # more than any workspace these calls take


def on_a_block_of(fill: float, batch, config: str, num_sms: int | None):
    """The call, with its workspace carved from a freed block that held ``fill``."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    junk = torch.full((POOL_BYTES // 4,), fill, dtype=torch.float32, device="cuda")
    del junk  # back to the allocator's cache, its values left in place
    out, lse = run_kernel(batch, config, validate=False, num_sms=num_sms)
    torch.cuda.synchronize()
    return out.clone(), lse.clone()


def main() -> int:
    cuda = torch.device("cuda")
    rng = random.Random(80)
    batches = [make_batch(rng, cuda, *case) for case in CASES]
    wrong = calls = 0
    configs = gpu_configs()
    for config in ("auto", *configs):
        for batch in batches:
            for num_sms in SM_COUNTS:
                label = f"{describe(batch)} config={config} num_sms={num_sms}"
                clean, clean_lse = on_a_block_of(0.0, batch, config, num_sms)
                dirty, dirty_lse = on_a_block_of(float("nan"), batch, config, num_sms)
                calls += 1
                try:
                    assert_close(clean, clean_lse, batch, f"{label}, zeroed block")
                except AssertionError as e:
                    wrong += 1
                    print(f"FAIL {str(e).splitlines()[0]}", flush=True)
                    continue
                same = torch.equal(clean.view(torch.int16), dirty.view(torch.int16)) and torch.equal(
                    clean_lse.view(torch.int32), dirty_lse.view(torch.int32)
                )
                if not same:
                    wrong += 1
                    bad = (clean.view(torch.int16) != dirty.view(torch.int16)).any(-1).sum().item()
                    print(f"DIFF {label}: {bad} (token, head) rows differ on the NaN block", flush=True)
    print(f"workspace workload done: {', '.join(configs)}; {wrong} of {calls} calls wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
