"""Workload for compute-sanitizer (run by tests/test_kernel_sanitizer.py, not collected by pytest).

`default`: the kernel on the smoke bundle, on a small random ragged batch with a NaN-filled,
shuffled pool and on one request (also with a kv_indices and a q longer than its indptrs say,
unvalidated, and laid out for the RTX PRO 6000's 188 SMs: more CTAs and partials than this GPU's,
in two waves on an H200), in every tile config the GPU runs, so memcheck sees every gather, mask
and combine path and racecheck sees the shared-memory exchanges between warps.
`long`: the same request laid out for one SM (no split: each CTA runs ~95 KV tiles, its stages
refilled ~47 times). `all`: both. A second argument narrows the configs: `only:a,b` or
`except:a,b` (tile config names; default every config the GPU runs).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_kernel_gpu import gpu_configs, make_batch, random_batch, run_kernel  # noqa: E402

from harness import bundles  # noqa: E402

WORKLOADS = ("default", "long", "all")


def calls(workload: str) -> list[Callable[[str], torch.Tensor]]:
    """The workload's kernel calls, each taking a config and returning the output to check; the
    inputs are made once, before any config runs."""
    cuda = torch.device("cuda")
    one = make_batch(random.Random(98), cuda, [3000], [16], 8)
    out = []
    if workload in ("default", "all"):
        smoke = bundles.to_batch(bundles.load("smoke"), "cuda")
        small = random_batch(random.Random(99), cuda, work_cap=3e5)
        longer = torch.cat([one.kv_indices, one.kv_indices[:500]])
        longer_q = torch.cat([one.q, one.q[:3]])
        out += [lambda c, b=b: run_kernel(b, config=c)[0] for b in (smoke, small, one)]
        out += [
            lambda c: run_kernel(one, c, validate=False, kv_indices=longer)[0],
            lambda c: run_kernel(one, c, validate=False, q=longer_q)[0][: one.q.shape[0]],
            lambda c: run_kernel(one, c, num_sms=188)[0],
        ]
    if workload in ("long", "all"):
        out.append(lambda c: run_kernel(one, c, num_sms=1)[0])
    return out


def pick_configs(arg: str | None) -> tuple[str, ...]:
    """Every config the GPU runs, narrowed by ``only:a,b`` or ``except:a,b``."""
    configs = gpu_configs()
    if arg is None:
        return configs
    mode, _, names = arg.partition(":")
    chosen = set(names.split(","))
    if mode not in ("only", "except") or not chosen <= set(configs):
        raise ValueError(f"configs must be only:NAMES or except:NAMES among {configs}, got {arg!r}")
    return tuple(c for c in configs if (c in chosen) == (mode == "only"))


def main(argv: list[str]) -> int:
    workload = argv[0] if argv else "all"
    if workload not in WORKLOADS:
        print(f"workload must be one of {WORKLOADS}, got {workload!r}", file=sys.stderr)
        return 2
    try:
        configs = pick_configs(argv[1] if len(argv) > 1 else None)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    workload_calls = calls(workload)
    for config in configs:
        outs = [call(config) for call in workload_calls]
        torch.cuda.synchronize()
        for out in outs:
            if not torch.isfinite(out.float()).all():
                print(f"non-finite output, config {config}", file=sys.stderr)
                return 1
    print(f"sanitizer workload {workload} done: {', '.join(configs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
