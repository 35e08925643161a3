"""Workload for compute-sanitizer (run by tests/test_kernel_sanitizer.py, not collected by pytest).

Runs the kernel on the smoke bundle and on a small random ragged batch with a NaN-filled,
shuffled pool, in every tile config the GPU runs, so memcheck sees every gather, mask and combine path and
racecheck sees the shared-memory exchanges between warps.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_kernel_gpu import gpu_configs, random_batch, run_kernel  # noqa: E402

from harness import bundles  # noqa: E402


def main() -> int:
    smoke = bundles.to_batch(bundles.load("smoke"), "cuda")
    small = random_batch(random.Random(99), torch.device("cuda"), work_cap=3e5)
    for config in gpu_configs():
        for batch in (smoke, small):
            out, lse = run_kernel(batch, config=config)
            torch.cuda.synchronize()
            if not torch.isfinite(out.float()).all():
                print(f"non-finite output, config {config}", file=sys.stderr)
                return 1
    print("sanitizer workload done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
