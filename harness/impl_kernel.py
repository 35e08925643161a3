"""Registry entry for this project's CUDA kernel ("verify-attn-cuda")."""

from __future__ import annotations

import torch

from harness.batch import VerifyBatch
from harness.registry import Implementation, RunFn, register

NAME = "verify-attn-cuda"


def _availability(device: torch.device) -> tuple[bool, str]:
    if torch.device(device).type != "cuda":
        return False, f"needs a CUDA device, got {device}"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    # A failed build is not "unavailable": prepare() builds, and its exception makes the run an
    # error, which fails parity and the regression gate.
    return True, ""


def prepare(batch: VerifyBatch, config: str = "auto") -> RunFn:
    """Packs the tree once, validates once, and returns the call (no host sync inside it)."""
    import kernel

    tree_mask, tree_mask_indptr = kernel.pack_parents(batch.parents)
    tree_mask = tree_mask.to(batch.device)
    tree_mask_indptr = tree_mask_indptr.to(batch.device)
    args = (
        batch.q,
        batch.kv_cache,
        batch.kv_indices,
        batch.qo_indptr,
        batch.kv_indptr,
        tree_mask,
        tree_mask_indptr,
    )
    out = torch.empty(batch.q.shape[0], batch.num_heads, 512, dtype=torch.bfloat16, device=batch.device)
    lse = torch.empty(batch.q.shape[0], batch.num_heads, dtype=torch.float32, device=batch.device)
    # One validated call up front: bad inputs fail here with a named argument, not in a timed loop.
    kernel.verify_attention(*args, batch.sm_scale, out=out, lse=lse, validate=True, config=config)

    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        return kernel.verify_attention(*args, batch.sm_scale, out=out, lse=lse, validate=False, config=config)

    return run


register(
    Implementation(
        name=NAME,
        description="this project's kernel: mma.sync bf16, split-K over the prefix, shared KV tiles",
        availability=_availability,
        prepare=prepare,
        device_kind="cuda",
    )
)
