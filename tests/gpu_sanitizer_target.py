"""Workload for compute-sanitizer (run by tests/test_kernel_sanitizer.py, not collected by pytest).

Runs the kernel on the smoke bundle, on a small random ragged batch with a NaN-filled, shuffled
pool and on one request (also with a kv_indices and a q longer than its indptrs say, unvalidated),
in every tile config the GPU runs, so memcheck sees every gather, mask and combine path and racecheck sees
the shared-memory exchanges between warps. The one request also runs laid out for other SM counts
(``num_sms``), whose partial workspaces and grids differ from this GPU's.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_kernel_gpu import gpu_configs, make_batch, random_batch, run_kernel  # noqa: E402

from harness import bundles  # noqa: E402


def main() -> int:
    smoke = bundles.to_batch(bundles.load("smoke"), "cuda")
    small = random_batch(random.Random(99), torch.device("cuda"), work_cap=3e5)
    one = make_batch(random.Random(98), torch.device("cuda"), [3000], [16], 8)
    longer = torch.cat([one.kv_indices, one.kv_indices[:500]])
    longer_q = torch.cat([one.q, one.q[:3]])
    for config in gpu_configs():
        outs = [run_kernel(batch, config=config)[0] for batch in (smoke, small, one)]
        outs.append(run_kernel(one, config, validate=False, kv_indices=longer)[0])
        outs.append(run_kernel(one, config, validate=False, q=longer_q)[0][: one.q.shape[0]])
        # Laid out for the RTX PRO 6000's 188 SMs (more CTAs and partials than this GPU's, in two
        # waves on an H200) and for one SM (no split).
        outs += [run_kernel(one, config, num_sms=n)[0] for n in (188, 1)]
        torch.cuda.synchronize()
        for out in outs:
            if not torch.isfinite(out.float()).all():
                print(f"non-finite output, config {config}", file=sys.stderr)
                return 1
    print("sanitizer workload done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
