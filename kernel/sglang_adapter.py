"""Drop-in for SGLang's Triton ``extend_attention_fwd`` on MLA target-verify, running this kernel.

At ``TritonAttnBackend.forward_extend`` for an MLA verify step SGLang holds:

    q_extend      [N, H, 576]   bf16   the draft tokens' queries
    k_extend      [N, 1, 576]   bf16   the draft tokens' KV rows, already written to the pool
    v_extend      [N, 1, 512]   bf16   at out_cache_loc (so this kernel reads them from there)
    o_extend      [N, H, 512]   bf16   written in place
    k_buffer      [S, 1, 576]   bf16   the page_size=1 pool
    v_buffer      [S, 1, 512]   bf16   k_buffer[..., :512] (a view of the same storage)
    qo_indptr     [B+1]         int32
    kv_indptr     [B+1]         int32  cumsum of the prefix lengths (prefix only)
    kv_indices    [>= sum P]    int64  the prefix slots (may be over-allocated past kv_indptr[B])
    custom_mask   [sum T*(P+T)] bool   per request a row-major T x (P+T) block (None: no mask)
    mask_indptr   [B+1]         int64  where each request's block starts
    out_cache_loc [N]           int64  the draft tokens' slots
    is_causal, max_len_extend, k_scale, v_scale, sm_scale (host values)

This kernel takes, per request, its prefix slots then its draft slots in one ``kv_indices``
and the draft-to-draft visibility as packed bits (kernel/tree_mask.py).
:func:`verify_metadata_from_sglang` builds those on the device (one Triton launch on a CUDA
device, torch ops elsewhere): no ``.item()``, no host copy, every shape from host
ints SGLang already has (batch size, ``max_len_extend``, the number of draft tokens, and
``sum P`` when the backend knows it), so the conversion and the kernel call can be captured in
a CUDA graph.

``prefix_len_sum`` (``sum P``) sizes the converted ``kv_indices``. Pass it on eager calls only,
or as a bound that every replay's ``sum P`` stays within: a CUDA graph freezes the size it had at
capture (SGLang captures with placeholder lengths), and a replay with longer prefixes would then
address past the converted list. Without it the conversion spans SGLang's own ``kv_indices``
buffer, which a graph's replays all fit.

**Cost.** SGLang keeps the prefix slots and the draft tokens' slots apart, and its tree as a
byte mask; this kernel reads one slot list and packed bits. On a CUDA device one Triton launch
(kernel/sglang_metadata.py) builds all of it, its work the step's ``sum P + N`` slots and ``N``
mask rows whatever the length of SGLang's ``kv_indices`` buffer, its memory its outputs (the
slot list int32, that length + N). That length is ``sum P`` eager, and in SGLang's CUDA-graph
mode one buffer of ``max_num_tokens * max_context_len`` entries (sglang 0.5.23,
``TritonAttnBackend.init_cuda_graph_state``): ~21M for 32 x 4 draft tokens at DeepSeek-V3's
163840 context, so an 84 MB list. Measured on an H200 (reports/README.md, the adapter's runs):
the conversion 6-8 us eager or in a graph, at any buffer length; torch ops over the whole buffer
(still the path for CPU and meta tensors) took 2.3 ms and 1.2 GB at 21M, and 0.15-0.2 ms at an
exact length. The kernel's call costs the same with the long list as with an exact one (its L2
prefetch stops at ``kv_indptr[B]``, kernel/NOTES.md v77). The list must stay within the kernel's
2^30 - 64 bound: ``max_num_tokens * max_context_len + N`` up to ~6,500 tokens at a 163840 context. The
conversion is the same for every layer of a step: build it once per forward with
:func:`verify_metadata_from_sglang` and pass it as ``metadata=`` to each layer's call. A kernel
that read SGLang's two slot lists as they are would save the list's memory; it is not built.

The prefix columns of ``custom_mask`` are not read: every draft token sees its whole prefix, as
in SGLang's own kernel (its ``skip_prefix_custom_mask`` defaults to True, and SGLang may leave
those columns unfilled). ``k_extend`` / ``v_extend`` are not read either: the draft tokens' rows
must already be in the pool at ``out_cache_loc`` (SGLang's MLA forward saves them first).
In SGLang's graph buffers ``qo_indptr`` is int64 and ``custom_mask`` an over-allocated uint8
buffer; both are taken as they come.

Preconditions, as in SGLang's own kernel: ``max_len_extend`` is at least every request's number
of draft tokens, ``kv_indices`` holds ``kv_indptr[B]`` slots, and ``mask_indptr`` lays out each
request's ``T_b x (P_b + T_b)`` block back to back from the start of ``custom_mask``. Calls in
hot loops are not checked against them (that needs the device's data on the host);
``extend_attention_fwd(..., validate=True)`` checks them, and every check ``verify_attention``
makes, on an eager call.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

from . import verify_attention
from .tree_mask import words_per_row

V_DIM = 512


@dataclass(frozen=True)
class VerifyMetadata:
    """This kernel's view of one SGLang verify step.

    kv_indices and tree_mask are sized from host ints only, so they can be longer than their
    indptr's last entry: kv_indices when SGLang's ``kv_indices`` is over-allocated and
    ``prefix_len_sum`` is not given (that tail unwritten on a CUDA device, zero elsewhere),
    tree_mask when requests with more than 32 draft tokens differ in ``words_per_row`` (zero).
    The kernel reads only what the indptrs address.
    """

    kv_indices: torch.Tensor  # [K] int32, K = prefix_len_sum (or SGLang's kv_indices.numel()) + N
    kv_indptr: torch.Tensor  # [B+1] int32, cumsum of P_b + T_b
    qo_indptr: torch.Tensor  # [B+1] int32, SGLang's qo_indptr as this kernel takes it
    tree_mask: torch.Tensor  # [N * words_per_row(max_len_extend)] int32
    tree_mask_indptr: torch.Tensor  # [B+1] int32


def _request_of(indptr: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per position the request whose [indptr[b], indptr[b+1]) holds it (clamped to the last)."""
    b = torch.searchsorted(indptr[1:], positions, right=True)
    return b.clamp_(max=indptr.numel() - 2)


def _words_to_int32(words: torch.Tensor) -> torch.Tensor:
    # Sums of 32 bits fit int64; int32 holds bit 31 as the sign, as kernel/tree_mask.py does.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _by_triton(kv_indices: torch.Tensor) -> bool:
    """The conversion by kernel/sglang_metadata.py (one launch, work that follows the step's
    lengths) on a CUDA device, or on the CPU under Triton's interpreter; by torch ops over the
    whole buffer elsewhere (CPU and meta tensors), and wherever Triton is not installed."""
    on_device = kv_indices.is_cuda or (
        kv_indices.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    )
    return on_device and _have_triton()


@functools.cache
def _have_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


_INDEX_DTYPES = (torch.int32, torch.int64)
_MASK_DTYPES = (torch.bool, torch.uint8)


def _check_sglang_types(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    prefix_len_sum: int | None,
) -> None:
    """What the conversion takes, from the tensors' dtypes and ranks and the host ints only (no
    data read: it runs under CUDA-graph capture too); raises naming the argument."""
    tensors = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices}
    tensors |= {
        name: t
        for name, t in (("out_cache_loc", out_cache_loc), ("mask_indptr", mask_indptr))
        if t is not None
    }
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got {got}")
    if custom_mask is not None and (
        not isinstance(custom_mask, torch.Tensor)
        or custom_mask.dim() != 1
        or custom_mask.dtype not in _MASK_DTYPES
    ):
        got = (
            f"{custom_mask.dtype} of shape {tuple(custom_mask.shape)}"
            if isinstance(custom_mask, torch.Tensor)
            else type(custom_mask).__name__
        )
        raise ValueError(f"custom_mask must be None or a 1-D bool or uint8 tensor, got {got}")
    for name, value, optional in (
        ("max_len_extend", max_len_extend, False),
        ("prefix_len_sum", prefix_len_sum, True),
    ):
        if (value is None and not optional) or (
            value is not None and (isinstance(value, bool) or not isinstance(value, int))
        ):
            raise ValueError(f"{name} must be an int{' or None' if optional else ''}, got {value!r}")


def _check_indptr_shapes(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> None:
    if qo_indptr.dim() != 1 or qo_indptr.numel() < 1 or kv_indptr.shape != qo_indptr.shape:
        raise ValueError(
            f"qo_indptr and kv_indptr must both be [B+1], got {tuple(qo_indptr.shape)} and {tuple(kv_indptr.shape)}"
        )


def verify_metadata_from_sglang(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    is_causal: bool = True,
    prefix_len_sum: int | None = None,
) -> VerifyMetadata:
    """Convert SGLang's verify metadata (module docstring) to this kernel's, on their device.

    With ``custom_mask`` the draft block of each request's mask is the visibility, and
    ``is_causal`` additionally hides later draft tokens (a no-op for a tree, whose parents
    precede their children; SGLang's own kernel bounds columns per tile of rows instead, which
    agrees for such masks only). Without one, ``is_causal`` gives a chain, else full visibility.
    """
    _check_sglang_types(
        qo_indptr,
        kv_indptr,
        kv_indices,
        out_cache_loc,
        custom_mask,
        mask_indptr,
        max_len_extend,
        prefix_len_sum,
    )
    device = qo_indptr.device
    n = out_cache_loc.numel()
    if max_len_extend < 1:
        raise ValueError(f"max_len_extend = {max_len_extend}; every request has at least one draft token")
    _check_indptr_shapes(qo_indptr, kv_indptr)
    num_prefix_slots = kv_indices.numel()
    if prefix_len_sum is not None and not 0 <= prefix_len_sum <= num_prefix_slots:
        raise ValueError(
            f"prefix_len_sum = {prefix_len_sum} must be in [0, kv_indices.numel() = {num_prefix_slots}]: "
            "kv_indices holds every request's prefix slots"
        )
    k = (num_prefix_slots if prefix_len_sum is None else prefix_len_sum) + n
    if qo_indptr.numel() == 1:  # an empty batch: nothing for the kernel to read
        return VerifyMetadata(
            kv_indices=torch.zeros(k, dtype=torch.int32, device=device),
            kv_indptr=torch.zeros(1, dtype=torch.int32, device=device),
            qo_indptr=torch.zeros(1, dtype=torch.int32, device=device),
            tree_mask=torch.zeros(0, dtype=torch.int32, device=device),
            tree_mask_indptr=torch.zeros(1, dtype=torch.int32, device=device),
        )
    if custom_mask is not None and (mask_indptr is None or mask_indptr.shape != qo_indptr.shape):
        got = None if mask_indptr is None else tuple(mask_indptr.shape)
        raise ValueError(
            f"mask_indptr must be [B+1] = {tuple(qo_indptr.shape)} with a custom_mask, got {got}"
        )
    if _by_triton(kv_indices):
        from .sglang_metadata import convert

        got = convert(
            qo_indptr,
            kv_indptr,
            kv_indices,
            out_cache_loc,
            custom_mask,
            mask_indptr,
            words_per_row(max_len_extend),
            is_causal,
            k,
        )
        return VerifyMetadata(
            kv_indices=got.kv_indices,
            kv_indptr=got.kv_indptr,
            qo_indptr=got.qo_indptr,
            tree_mask=got.tree_mask,
            tree_mask_indptr=got.tree_mask_indptr,
        )
    return _convert_torch(
        qo_indptr,
        kv_indptr,
        kv_indices,
        out_cache_loc,
        custom_mask,
        mask_indptr,
        max_len_extend,
        is_causal,
        k,
    )


def _convert_torch(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    is_causal: bool,
    k: int,
) -> VerifyMetadata:
    """kernel/sglang_metadata.py's conversion by torch ops, over all k positions of the slot list
    (its tail past the last request zero, as the tree mask's)."""
    device = qo_indptr.device
    n = out_cache_loc.numel()
    qo = qo_indptr.to(torch.int64)
    kvp = kv_indptr.to(torch.int64)
    num_draft = qo[1:] - qo[:-1]
    prefix_len = kvp[1:] - kvp[:-1]
    ours_indptr = kvp + qo

    # kv_indices: position j of the output is request b's (j - ours_indptr[b])-th slot, from the
    # prefix slots or out_cache_loc (concatenated, so one gather serves both).
    j = torch.arange(k, device=device)
    b = _request_of(ours_indptr, j)
    r = j - ours_indptr[b]
    in_prefix = r < prefix_len[b]
    src = torch.where(in_prefix, kvp[b] + r, kv_indices.numel() + qo[b] + r - prefix_len[b])
    used = j < ours_indptr[-1]
    sources = torch.cat([kv_indices.to(torch.int64), out_cache_loc.to(torch.int64)])
    ours_kv_indices = torch.where(used, sources[torch.where(used, src, 0)], 0).to(torch.int32)

    # Tree mask: row i of request b packs draft columns [0, T_b) into words_per_row(T_b) words.
    w_max = words_per_row(max_len_extend)
    row = torch.arange(n, device=device)
    rb = _request_of(qo, row)
    i = (row - qo[rb])[:, None]
    t = num_draft[rb][:, None]
    col = torch.arange(32 * w_max, device=device)[None, :]
    bits = col < t
    if custom_mask is not None:
        p = prefix_len[rb][:, None]
        flat = mask_indptr.to(torch.int64)[rb][:, None] + i * (p + t) + p + col
        bits = bits & custom_mask[torch.where(bits, flat, 0)].to(torch.bool)
    if is_causal:
        bits = bits & (col <= i)
    shifts = torch.arange(32, device=device, dtype=torch.int64)
    words = _words_to_int32((bits.view(n, w_max, 32).to(torch.int64) << shifts).sum(-1))  # [N, w_max]

    wpr = (num_draft + 31) // 32
    mask_indptr_ours = torch.cat(
        [torch.zeros(1, dtype=torch.int64, device=device), torch.cumsum(num_draft * wpr, 0)]
    )
    w = torch.arange(w_max, device=device)[None, :]
    target = mask_indptr_ours[rb][:, None] + i * wpr[rb][:, None] + w
    # Words past a row's words_per_row are zero; they all land in one spare slot, dropped below.
    # So do words past the buffer, which only a max_len_extend below some T_b produces (a broken
    # precondition: never an out-of-bounds write, and validate=True names it).
    target = torch.where(w < wpr[rb][:, None], target, n * w_max).clamp_(max=n * w_max)
    tree_mask = torch.zeros(n * w_max + 1, dtype=torch.int32, device=device)
    tree_mask.scatter_(0, target.reshape(-1), words.reshape(-1))

    return VerifyMetadata(
        kv_indices=ours_kv_indices,
        kv_indptr=ours_indptr.to(torch.int32),
        qo_indptr=qo_indptr.to(torch.int32),
        tree_mask=tree_mask[: n * w_max],
        tree_mask_indptr=mask_indptr_ours.to(torch.int32),
    )


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    k_scale: float,
    v_scale: float,
    sm_scale: float,
    logit_cap: float = 0.0,
    *,
    out_cache_loc: torch.Tensor,
    prefix_len_sum: int | None = None,
    metadata: VerifyMetadata | None = None,
    lse: torch.Tensor | None = None,
    skip_prefix_custom_mask: bool = True,
    config: str = "auto",
    validate: bool = False,
    sliding_window_size: int = -1,
    sinks: torch.Tensor | None = None,
    window_kv_offsets: torch.Tensor | None = None,
    xai_temperature_len: int = -1,
    page_size: int = 1,
    score_mod: object = None,
    aux_tensors: object = None,
    extend_seq_lens_cpu: object = None,
) -> torch.Tensor:
    """SGLang's MLA verify call (same arguments), computed by this kernel into ``o_extend``.

    Call it for target-verify steps only (e.g. from an override of the backend's
    ``_forward_extend_kernel``, which serves every extend), with that step's ``out_cache_loc``
    (and ``prefix_len_sum`` when known): a fresh tensor each eager batch, so it is passed per
    step, never bound once (harness/SGLANG.md, "Where it plugs in"). ``k_extend`` and ``v_extend`` are accepted
    but not read: the backend has already written those rows to the pool at ``out_cache_loc``,
    where this kernel reads them. ``sm_scale`` has no default (SGLang's 1/sqrt(576) is wrong for
    MLA). ``lse``, if given ([N, H] fp32), receives the log-sum-exp. The backend's other
    keywords are accepted at their no-op values (``extend_seq_lens_cpu`` only tunes SGLang's
    own launch grid); any other value raises, naming the argument. ``validate=True`` (eager
    calls only: it copies the metadata to the host) checks the module docstring's preconditions
    and runs ``verify_attention``'s own checks, each error naming its argument; use it while
    wiring the adapter in, and leave it off in the serving loop. ``metadata``: this step's
    :func:`verify_metadata_from_sglang` built once for all layers (the module docstring's cost);
    given, the call converts nothing and reads ``qo_indptr`` and ``out_cache_loc`` only for their
    shapes. Returns ``o_extend``.
    """
    if k_scale != 1.0 or v_scale != 1.0:
        raise ValueError(
            f"k_scale = {k_scale}, v_scale = {v_scale}: this kernel reads a bf16 pool unscaled (1.0)"
        )
    unsupported = {
        "logit_cap": (logit_cap, 0.0),
        "sliding_window_size": (sliding_window_size, -1),
        "sinks": (sinks, None),
        "window_kv_offsets": (window_kv_offsets, None),
        "xai_temperature_len": (xai_temperature_len, -1),
        "page_size": (page_size, 1),
        "score_mod": (score_mod, None),
        "aux_tensors": (aux_tensors, None),
        # False would apply the mask's prefix columns, which this kernel never reads
        "skip_prefix_custom_mask": (skip_prefix_custom_mask, True),
    }
    for name, (value, supported) in unsupported.items():
        if (value is not None) if supported is None else (value != supported):
            raise ValueError(
                f"{name} = {value!r}: this kernel supports only {supported!r} (MLA verify, page_size=1)"
            )
    if v_buffer.data_ptr() != k_buffer.data_ptr() or v_buffer.shape[-1] != V_DIM:
        got = [f"width {v_buffer.shape[-1]}"] if v_buffer.shape[-1] != V_DIM else []
        got += ["another address than k_buffer"] if v_buffer.data_ptr() != k_buffer.data_ptr() else []
        raise ValueError(
            f"v_buffer must be k_buffer[..., :{V_DIM}] (MLA reads V from the first {V_DIM} dims of each "
            f"KV row), got shape {tuple(v_buffer.shape)}: {' and '.join(got)}"
        )
    if out_cache_loc.numel() != q_extend.shape[0]:
        raise ValueError(
            f"out_cache_loc has {out_cache_loc.numel()} slots but q_extend has {q_extend.shape[0]} draft tokens"
        )
    if validate:
        check_sglang_metadata(
            qo_indptr,
            kv_indptr,
            kv_indices,
            max_len_extend,
            prefix_len_sum,
            custom_mask=custom_mask,
            mask_indptr=mask_indptr,
        )
    meta = metadata or verify_metadata_from_sglang(
        qo_indptr,
        kv_indptr,
        kv_indices,
        out_cache_loc,
        custom_mask,
        mask_indptr,
        max_len_extend,
        is_causal=is_causal,
        prefix_len_sum=prefix_len_sum,
    )
    kv_ours, mask_ours = meta.kv_indices, meta.tree_mask
    if validate:
        # verify_attention's checks expect exact sizes: the converted lists up to their indptrs.
        kv_ours = kv_ours[: int(meta.kv_indptr[-1])]
        mask_ours = mask_ours[: int(meta.tree_mask_indptr[-1])]
    verify_attention(
        q_extend,
        k_buffer,
        kv_ours,
        meta.qo_indptr,
        meta.kv_indptr,
        mask_ours,
        meta.tree_mask_indptr,
        sm_scale,
        out=o_extend,
        lse=lse,
        validate=validate,
        config=config,
    )
    return o_extend


def check_sglang_metadata(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_len_extend: int,
    prefix_len_sum: int | None = None,
    *,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
) -> None:
    """The adapter's preconditions on SGLang's metadata (module docstring), checked on the host:
    raises ValueError naming the argument. Copies the indptrs to the host (a sync), so it refuses
    to run while a CUDA graph is being captured. With ``custom_mask``, ``mask_indptr`` must lay
    out request b's ``T_b x (P_b + T_b)`` block as SGLang does: blocks back to back from the
    start of ``custom_mask`` and inside it (a block elsewhere would hand the kernel another request's tree, or stale
    bytes of an over-allocated buffer, and nothing downstream could tell)."""
    if qo_indptr.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError("validate=True reads the metadata on the host: not while a CUDA graph is captured")
    _check_sglang_types(
        qo_indptr,
        kv_indptr,
        kv_indices,
        None,  # out_cache_loc: the conversion checks it, and the kernel's validation its slots
        custom_mask,
        mask_indptr,
        max_len_extend,
        prefix_len_sum,
    )
    _check_indptr_shapes(qo_indptr, kv_indptr)
    qo, kvp = qo_indptr.cpu().to(torch.int64), kv_indptr.cpu().to(torch.int64)
    for name, ptr in (("qo_indptr", qo), ("kv_indptr", kvp)):
        if ptr[0] != 0 or bool((ptr[1:] < ptr[:-1]).any()):
            raise ValueError(f"{name} must start at 0 and never decrease, got {ptr.tolist()[:16]}")
    num_draft = qo[1:] - qo[:-1]
    if num_draft.numel() and int(num_draft.max()) > max_len_extend:
        b = int(num_draft.argmax())
        raise ValueError(
            f"max_len_extend = {max_len_extend}, but request {b} has {int(num_draft[b])} draft tokens "
            "(qo_indptr); it must be at least the largest"
        )
    if int(kvp[-1]) > kv_indices.numel():
        raise ValueError(
            f"kv_indices has {kv_indices.numel()} slots but kv_indptr addresses {int(kvp[-1])} prefix slots"
        )
    if prefix_len_sum is not None and prefix_len_sum < int(kvp[-1]):
        raise ValueError(
            f"prefix_len_sum = {prefix_len_sum} but kv_indptr addresses {int(kvp[-1])} prefix slots: "
            "it must be their sum (or a bound above it)"
        )
    if custom_mask is None:
        return
    if mask_indptr is None or mask_indptr.shape != qo_indptr.shape:
        got = None if mask_indptr is None else tuple(mask_indptr.shape)
        raise ValueError(
            f"mask_indptr must be [B+1] = {tuple(qo_indptr.shape)} with a custom_mask, got {got}"
        )
    mp = mask_indptr.cpu().to(torch.int64)
    sizes = num_draft * (kvp[1:] - kvp[:-1] + num_draft)
    if int(mp[0]) != 0:
        raise ValueError(f"mask_indptr[0] = {int(mp[0])}; expected 0 (SGLang's first block starts the mask)")
    wrong = torch.nonzero((mp[1:] - mp[:-1]) != sizes).flatten()
    if wrong.numel():
        b = int(wrong[0])
        raise ValueError(
            f"mask_indptr[{b + 1}] - mask_indptr[{b}] = {int(mp[b + 1] - mp[b])}, expected request {b}'s "
            f"T * (P + T) = {int(num_draft[b])} * ({int(kvp[b + 1] - kvp[b])} + {int(num_draft[b])}) = {int(sizes[b])} "
            "(qo_indptr, kv_indptr): SGLang lays the blocks back to back"
        )
    if int(mp[-1]) > custom_mask.numel():
        raise ValueError(
            f"mask_indptr[-1] = {int(mp[-1])} is past the end of custom_mask ({custom_mask.numel()} entries)"
        )
