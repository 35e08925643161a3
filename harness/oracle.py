"""The exact reference: verify attention in float64, the naive way, one request at a time.

For request b, query row (i, h) attends to every prefix key and to the draft keys that draft
token i sees (itself and its ancestors); scores are ``sm_scale * q . k`` over all 576 dims, the
value is the first 512 dims of each key row. The prefix is consumed in chunks of ``chunk`` keys,
merged with the usual running (max, sum, weighted sum), so a 256k prefix needs a few hundred MB
at most; everything stays on the batch's device (CPU or CUDA).

    out [N, H, 512] float64, lse [N, H] float64 (natural log of the softmax denominator)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from harness import tree
from harness.batch import QK_DIM, V_DIM, VerifyBatch


def reference(
    batch: VerifyBatch,
    *,
    chunk: int = 8192,
    visibility: Sequence[torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [N, H, 512], lse [N, H]) of ``batch`` on its device, computed in ``dtype`` (float64,
    the goldens'; float32 gives the error of an honest kernel's fp32 accumulation).

    ``visibility`` overrides the draft mask with per-request [T_b, T_b] bool matrices (row i:
    the draft tokens query i sees); by default it comes from ``batch.parents``.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk = {chunk!r}; expected an int >= 1")
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype = {dtype!r}; expected torch.float64 or torch.float32")
    scale = batch.sm_scale
    if (
        isinstance(scale, bool)
        or not isinstance(scale, numbers.Real)
        or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(f"sm_scale = {scale!r}; expected a finite positive number")
    qo, kv = batch.host_indptrs()
    if visibility is not None and len(visibility) != batch.batch_size:
        raise ValueError(
            f"visibility has {len(visibility)} matrices, expected one per request ({batch.batch_size})"
        )
    pool = batch.pool()
    device = batch.device
    q = batch.q.to(dtype)
    n, h = q.shape[0], q.shape[1]
    out = torch.empty(n, h, V_DIM, dtype=dtype, device=device)
    lse = torch.empty(n, h, dtype=dtype, device=device)
    for b, (p, parents) in enumerate(zip(batch.prefix_lens, batch.parents, strict=True)):
        t = len(parents)
        qb = q[qo[b] : qo[b + 1]].reshape(t * h, QK_DIM)
        slots = batch.kv_indices[kv[b] : kv[b + 1]].to(device=pool.device, dtype=torch.long)
        if visibility is None:
            vis = tree.visibility(parents, f"parents[{b}]")
        else:
            vis = visibility[b]
            if not isinstance(vis, torch.Tensor) or vis.shape != (t, t) or vis.dtype != torch.bool:
                got = (
                    f"{vis.dtype} {tuple(vis.shape)}" if isinstance(vis, torch.Tensor) else type(vis).__name__
                )
                raise ValueError(f"visibility[{b}] must be a bool tensor of shape ({t}, {t}), got {got}")
            if p == 0 and not bool(vis.any(dim=1).all()):
                i = int(torch.nonzero(~vis.any(dim=1))[0])
                raise ValueError(
                    f"visibility[{b}] row {i} sees no key (request {b} has no prefix): its softmax is empty"
                )
        # Draft key j is hidden from row (i, h) unless vis[i, j]: same mask for every head.
        draft_mask = vis.to(device).repeat_interleave(h, dim=0)  # [T*H, T]

        row_max = torch.full((t * h,), -torch.inf, dtype=dtype, device=device)
        row_sum = torch.zeros(t * h, dtype=dtype, device=device)
        acc = torch.zeros(t * h, V_DIM, dtype=dtype, device=device)
        blocks = [(s, min(s + chunk, p), None) for s in range(0, p, chunk)] + [(p, p + t, draft_mask)]
        for start, stop, mask in blocks:
            keys = pool[slots[start:stop]].to(device=device, dtype=dtype)
            scores = (qb @ keys.T) * scale  # [T*H, keys]
            if mask is not None:
                scores = scores.masked_fill(~mask, -torch.inf)
            new_max = torch.maximum(row_max, scores.max(dim=1).values)
            rescale = torch.exp(row_max - new_max)
            weights = torch.exp(scores - new_max[:, None])
            row_sum = row_sum * rescale + weights.sum(dim=1)
            acc = acc * rescale[:, None] + weights @ keys[:, :V_DIM]
            row_max = new_max
        out[qo[b] : qo[b + 1]] = (acc / row_sum[:, None]).view(t, h, V_DIM)
        lse[qo[b] : qo[b + 1]] = (row_max + torch.log(row_sum)).view(t, h)
    return out, lse
