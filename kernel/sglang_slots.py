"""The SGLang adapter's slot list, built by a Triton kernel whose work follows the step's lengths.

SGLang keeps a verify step's prefix slots (``kv_indices``, per request ``kv_indptr``) apart from
its draft tokens' slots (``out_cache_loc``, per request ``qo_indptr``); this kernel reads one
list, per request its prefix slots then its draft slots. Torch ops can only build that list over
a length known on the host, so kernel/sglang_adapter.py's torch conversion spans SGLang's whole
``kv_indices`` buffer, which in CUDA-graph mode holds ``max_num_tokens * max_context_len``
entries whatever the step uses. Here one program per (request, slice) reads its request's
lengths on the device and copies only that request's slots: the work is the step's
``sum P + N`` entries, with no host sync (graph-capturable), and the only memory is the output.

Loads and stores are bounded by the buffers' sizes (``num_prefix_slots``, ``num_draft``,
``out_len``), so metadata that breaks the adapter's preconditions gives wrong slots, never an
access outside a buffer (``validate=True`` names the broken precondition). Entries of the output
past ``kv_indptr[B] + qo_indptr[B]`` are not written: the kernel never reads them.

Imported only when a conversion runs on a CUDA device (or under ``TRITON_INTERPRET=1``), so the
rest of ``kernel`` does not need Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
# Programs a request at most; each loops over its request's slots, so a long prefix is copied by
# up to this many programs and a graph-sized buffer costs no more programs than the batch needs.
MAX_PROGRAMS = 1024


@triton.jit
def _merge_slots(
    kv_indptr,  # [B+1] the prefixes' indptr (SGLang's)
    qo_indptr,  # [B+1] the draft tokens' indptr
    kv_indices,  # [num_prefix_slots] prefix slots
    out_cache_loc,  # [num_draft] draft slots
    out,  # [out_len] int32: request b's P_b + T_b slots from kv_indptr[b] + qo_indptr[b]
    num_prefix_slots,
    num_draft,
    out_len,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    stride = tl.num_programs(1) * BLOCK
    p0 = tl.load(kv_indptr + b).to(tl.int64)
    p1 = tl.load(kv_indptr + b + 1).to(tl.int64)
    q0 = tl.load(qo_indptr + b).to(tl.int64)
    q1 = tl.load(qo_indptr + b + 1).to(tl.int64)
    prefix = p1 - p0
    total = prefix + (q1 - q0)
    dst0 = p0 + q0
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    for start in range(g * BLOCK, total, stride):
        r = start + lanes
        ok = r < total
        in_prefix = r < prefix
        src_p = p0 + r
        src_d = q0 + r - prefix
        from_prefix = tl.load(
            kv_indices + src_p, mask=ok & in_prefix & (src_p >= 0) & (src_p < num_prefix_slots), other=0
        )
        from_draft = tl.load(
            out_cache_loc + src_d, mask=ok & (r >= prefix) & (src_d >= 0) & (src_d < num_draft), other=0
        )
        slot = tl.where(in_prefix, from_prefix, from_draft).to(tl.int32)
        dst = dst0 + r
        tl.store(out + dst, slot, mask=ok & (dst >= 0) & (dst < out_len))


def merge_slots(
    kv_indptr: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    out_len: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per request b, its prefix slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` then its draft
    slots ``out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]``, from ``kv_indptr[b] + qo_indptr[b]`` of a
    new int32 tensor of ``out_len`` entries (its tail past the last request's end unwritten).
    Sizes the launch from host ints only: B and ``out_len``. ``out``: write there instead (int32,
    at least ``out_len`` entries; nothing past ``out_len`` is written)."""
    batch = qo_indptr.numel() - 1
    if out is None:
        out = torch.empty(out_len, dtype=torch.int32, device=kv_indices.device)
    if batch < 1 or out_len == 0:
        return out
    # Programs a request: enough to cover out_len spread evenly over the batch, at most
    # MAX_PROGRAMS over the whole grid (and at least one a request).
    per_request = max(1, min(triton.cdiv(out_len, batch * BLOCK), MAX_PROGRAMS // batch))
    _merge_slots[(batch, per_request)](
        kv_indptr,
        qo_indptr,
        kv_indices,
        out_cache_loc,
        out,
        kv_indices.numel(),
        out_cache_loc.numel(),
        out_len,
        BLOCK=BLOCK,
    )
    return out
