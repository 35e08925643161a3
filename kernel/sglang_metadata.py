"""The SGLang adapter's conversion in one Triton kernel, whose work follows the step's lengths.

SGLang keeps a verify step's prefix slots (``kv_indices``, per request ``kv_indptr``) apart from
its draft tokens' slots (``out_cache_loc``, per request ``qo_indptr``), and its tree as a byte
mask per request (``custom_mask`` at ``mask_indptr``: T x (P + T), row-major); this kernel reads
one slot list (per request its prefix slots, then its draft slots) and the draft-to-draft
visibility as packed bits (kernel/tree_mask.py). Torch ops can only work over lengths known on
the host, so kernel/sglang_adapter.py's torch conversion spans SGLang's whole ``kv_indices``
buffer, which in CUDA-graph mode holds ``max_num_tokens * max_context_len`` entries whatever the
step uses, and takes some forty small launches. Here one launch does it all: program (b, g) reads
request b's lengths on the device and copies its share of that request's slots and packs its
share of the request's mask rows; the programs with g = 0 write the three indptrs' entries. The
work is the step's ``sum P + N`` slots and ``N`` mask rows, with no host sync (graph-capturable),
and the only memory is the outputs.

Loads and stores are bounded by the buffers' sizes, so metadata that breaks the adapter's
preconditions gives wrong values, never an access outside a buffer (``validate=True`` names the
broken precondition). Entries of the outputs past what the indptrs address are not written: the
kernel never reads them.

Imported only when a conversion runs on a CUDA device (or under ``TRITON_INTERPRET=1``), so the
rest of ``kernel`` does not need Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK = 1024
# Programs a request at most; each loops over its share of its request's slots and mask rows,
# so a long prefix is copied by up to this many programs and a graph-sized buffer costs no more
# programs than the batch needs.
MAX_PROGRAMS = 1024


# The sizes change from step to step in eager serving: not specialised on (Triton would compile a
# variant for each size that is 1, or a multiple of 16, or neither), so the first steps compile
# once per (words, mask, causal) combination only.
@triton.jit(
    do_not_specialize=["num_prefix_slots", "num_draft", "out_len", "custom_mask_len", "tree_mask_len"]
)
def _convert(
    kv_indptr,  # [B+1] the prefixes' indptr (SGLang's)
    qo_indptr,  # [B+1] the draft tokens' indptr
    kv_indices,  # [num_prefix_slots] prefix slots
    out_cache_loc,  # [num_draft] draft slots
    custom_mask,  # [custom_mask_len] bytes (unread without HAS_MASK)
    mask_indptr,  # [B+1] where request b's T x (P + T) block starts (unread without HAS_MASK)
    out_kv_indices,  # [out_len] int32
    out_kv_indptr,  # [B+1] int32
    out_qo_indptr,  # [B+1] int32
    out_tree_mask,  # [tree_mask_len] int32
    out_tree_mask_indptr,  # [B+1] int32
    num_prefix_slots,
    num_draft,
    out_len,
    custom_mask_len,
    tree_mask_len,
    W_MAX: tl.constexpr,  # words_per_row(max_len_extend): words packed a row at most
    W_P2: tl.constexpr,  # W_MAX rounded up to a power of two
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    programs = tl.num_programs(1).to(tl.int64)
    p0 = tl.load(kv_indptr + b).to(tl.int64)
    p1 = tl.load(kv_indptr + b + 1).to(tl.int64)
    q0 = tl.load(qo_indptr + b).to(tl.int64)
    q1 = tl.load(qo_indptr + b + 1).to(tl.int64)
    prefix = p1 - p0
    t = q1 - q0
    wpr = (t + 31) // 32

    # Slots: request b's P_b prefix slots, then its T_b draft slots, from p0 + q0.
    total = prefix + t
    dst0 = p0 + q0
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    for start in range(g * BLOCK, total, programs * BLOCK):
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
        tl.store(out_kv_indices + dst, slot, mask=ok & (dst >= 0) & (dst < out_len))

    # This request's first mask word: the words of the requests before it.
    word0 = p0 * 0
    for bb in range(0, b):
        tb = tl.load(qo_indptr + bb + 1).to(tl.int64) - tl.load(qo_indptr + bb).to(tl.int64)
        word0 += tb * ((tb + 31) // 32)
    if g == 0:
        tl.store(out_kv_indptr + b + 1, (p1 + q1).to(tl.int32))
        tl.store(out_qo_indptr + b + 1, q1.to(tl.int32))
        tl.store(out_tree_mask_indptr + b + 1, (word0 + t * wpr).to(tl.int32))
        if b == 0:
            tl.store(out_kv_indptr, (p0 + q0).to(tl.int32))
            tl.store(out_qo_indptr, q0.to(tl.int32))
            tl.store(out_tree_mask_indptr, 0)

    # Mask rows: row i's draft columns [0, T_b) packed 32 a word, bit c of word w = column 32w + c.
    words = tl.arange(0, W_P2)
    bit = tl.arange(0, 32)
    col = words[:, None] * 32 + bit[None, :]
    shifts = bit.to(tl.int64)[None, :]
    if HAS_MASK:
        m0 = tl.load(mask_indptr + b).to(tl.int64)
    for i in range(g, t, programs):
        vis = (col < t) & (words[:, None] < W_MAX)
        if HAS_MASK:
            at = m0 + i * (prefix + t) + prefix + col
            byte = tl.load(custom_mask + at, mask=vis & (at >= 0) & (at < custom_mask_len), other=0)
            vis = vis & (byte != 0)
        if CAUSAL:
            vis = vis & (col <= i)
        packed = tl.sum(vis.to(tl.int64) << shifts, axis=1)  # [W_P2], each < 2^32
        dst = word0 + i * wpr + words
        keep = (words < wpr) & (words < W_MAX) & (dst >= 0) & (dst < tree_mask_len)
        tl.store(out_tree_mask + dst, packed.to(tl.int32), mask=keep)


@dataclass(frozen=True)
class Converted:
    kv_indices: torch.Tensor
    kv_indptr: torch.Tensor
    qo_indptr: torch.Tensor
    tree_mask: torch.Tensor
    tree_mask_indptr: torch.Tensor


def convert(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    words_max: int,
    is_causal: bool,
    out_len: int,
    out_kv_indices: torch.Tensor | None = None,
) -> Converted:
    """This kernel's metadata for SGLang's (kernel/sglang_adapter.py checks the arguments first):
    ``kv_indices`` of ``out_len`` int32 entries (request b's slots from ``kv_indptr[b] +
    qo_indptr[b]``), ``tree_mask`` of ``N * words_max`` words, and the three int32 indptrs. One
    launch, sized from host ints only: B, ``out_len``, ``words_max``. ``out_kv_indices``: write
    the slots there instead (int32, at least ``out_len`` entries; nothing past it is written)."""
    batch = qo_indptr.numel() - 1
    device = kv_indices.device
    n = out_cache_loc.numel()
    if out_kv_indices is None:
        out_kv_indices = torch.empty(out_len, dtype=torch.int32, device=device)
    got = Converted(
        kv_indices=out_kv_indices,
        kv_indptr=torch.empty(batch + 1, dtype=torch.int32, device=device),
        qo_indptr=torch.empty(batch + 1, dtype=torch.int32, device=device),
        tree_mask=torch.empty(n * words_max, dtype=torch.int32, device=device),
        tree_mask_indptr=torch.empty(batch + 1, dtype=torch.int32, device=device),
    )
    # Programs a request: enough to cover the slots spread evenly over the batch, at most
    # MAX_PROGRAMS over the whole grid, and at least one a request.
    per_request = max(1, min(triton.cdiv(max(out_len, 1), batch * BLOCK), MAX_PROGRAMS // batch))
    has_mask = custom_mask is not None
    _convert[(batch, per_request)](
        kv_indptr,
        qo_indptr,
        kv_indices,
        out_cache_loc,
        custom_mask if has_mask else kv_indices,
        mask_indptr if has_mask else kv_indptr,
        got.kv_indices,
        got.kv_indptr,
        got.qo_indptr,
        got.tree_mask,
        got.tree_mask_indptr,
        kv_indices.numel(),
        n,
        out_len,
        custom_mask.numel() if has_mask else 0,
        got.tree_mask.numel(),
        W_MAX=words_max,
        W_P2=triton.next_power_of_2(words_max),
        HAS_MASK=has_mask,
        CAUSAL=is_causal,
        BLOCK=BLOCK,
    )
    return got
