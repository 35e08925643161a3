"""One call of the kernel for Nsight Compute: python ncu_cfg.py P H T CONFIG (CONFIG 0 = auto).

The inputs as the A/B timings make them: one request, a pool 1.2x the keys with the request's
rows at shuffled slots and NaN elsewhere, random q and KV rows, a random tree of T tokens (seeded)."""

import math
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import kernel  # noqa: E402


def make(rng: random.Random, prefix: int, drafts: int, heads: int) -> dict:
    keys = prefix + drafts
    pool = keys + keys // 5 + 7
    g = torch.Generator(device="cuda").manual_seed(rng.randrange(1 << 30))
    kv = torch.full((pool, 576), float("nan"), dtype=torch.bfloat16, device="cuda")
    slots = torch.randperm(pool, generator=g, device="cuda")[:keys]
    kv[slots] = torch.randn(keys, 576, generator=g, device="cuda").bfloat16()
    q = torch.randn(drafts, heads, 576, generator=g, device="cuda").bfloat16()
    parents = (-1, *(rng.randrange(i) for i in range(1, drafts)))
    qo = torch.tensor([0, drafts], dtype=torch.int32, device="cuda")
    kvp = torch.tensor([0, keys], dtype=torch.int32, device="cuda")
    return dict(q=q, kv=kv, idx=slots.int(), qo=qo, kvp=kvp, parents=[parents])


mod = kernel.load_extension()
P, H, T, C = (int(x) for x in sys.argv[1:5])
d = make(random.Random(0), P, T, H)
m, mi = kernel.pack_parents(d["parents"])
m, mi = m.cuda(), mi.cuda()
for _ in range(2):  # the profiler takes the second launch (--launch-skip 1)
    mod.verify_attention(
        d["q"], d["kv"], d["idx"], d["qo"], d["kvp"], m, mi, 1 / math.sqrt(192), None, None, False, C, 0
    )
torch.cuda.synchronize()
