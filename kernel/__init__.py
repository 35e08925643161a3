"""verify-attention: tensor-core split-K verify attention for MLA tree drafts (page_size=1).

    from kernel import verify_attention, pack_parents

    tree_mask, tree_mask_indptr = pack_parents(parents)          # once per tree shape, on the CPU
    out, lse = verify_attention(q, kv_cache, kv_indices, qo_indptr, kv_indptr,
                                tree_mask.cuda(), tree_mask_indptr.cuda(), sm_scale)

The CUDA extension is built on first use (JIT, cached by a hash of the sources, target archs and nvcc flags; see
``kernel/build.py``).
"""

from __future__ import annotations

import numbers

import torch

from .build import load_extension
from .tree_mask import pack_parents, pack_visibility, visibility_from_parents, words_per_row

__all__ = [
    "verify_attention",
    "pack_parents",
    "pack_visibility",
    "visibility_from_parents",
    "words_per_row",
    "load_extension",
    "planned_config",
]


def verify_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    tree_mask: torch.Tensor,
    tree_mask_indptr: torch.Tensor,
    sm_scale: float,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    validate: bool = True,
    config: str = "auto",
    num_sms: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify attention of a ragged batch of draft trees against their paged prefixes.

    Args (all on one CUDA device):
        q:                [N, H, 576] bf16, N = sum_b T_b; 512 latent dims then 64 RoPE dims.
        kv_cache:         [S, 576] (or [S, 1, 576]) bf16; V is the first 512 dims of a row.
        kv_indices:       [K] int32, request b's slots at kv_indices[kv_indptr[b]:kv_indptr[b+1]]:
                          its P_b prefix slots, then the slots of its T_b draft tokens.
        qo_indptr:        [B+1] int32, request b's queries are q[qo_indptr[b]:qo_indptr[b+1]].
        kv_indptr:        [B+1] int32.
        tree_mask:        packed int32 visibility words (kernel/tree_mask.py).
        tree_mask_indptr: [B+1] int32 word offsets into tree_mask.
        sm_scale:         softmax scale applied to q.k: a Python number, finite, positive and
                          within float32's normal range (the kernel computes in float32). A tensor
                          is refused (reading it would be a copy from the device).
        out, lse:         optional preallocated outputs ([N, H, 512] bf16, [N, H] fp32). They
                          must not share memory with any input or with each other (the kernel
                          writes them while it still reads the inputs).
                          Every tensor must be contiguous and start aligned: q, kv_cache and out
                          at 16 bytes (a fresh tensor does; a view at an odd offset may not), the
                          int32 and fp32 ones at 4 (a tensor from another library may not).
                          Tokens x heads (and heads) are at most 2^30, kv_indices' length at
                          most 2^30 - 64.
        validate:         also check what needs the device data (indptr monotonic and consistent,
                          T_b >= 1, slots inside the pool, every draft token sees itself). This copies
                          the indptrs, the tree mask and kv_indices' min and max to the host (a
                          sync), so it is skipped while the stream is captured into a CUDA graph;
                          pass False in hot loops once the inputs are known good. Shape, dtype
                          and device checks always run. Only this stream's capture is seen: while
                          another thread captures a graph in the global capture mode (the
                          default of torch.cuda.graph), the copy would invalidate that capture,
                          so pass False there.
                          Unvalidated, kv_indices, tree_mask and q may run past their indptrs'
                          last entries (over-allocated buffers): the kernel reads only what the
                          indptrs address, and rows of out and lse past qo_indptr[-1] are not
                          written (with B = 0, none is: a fresh out and lse come back as
                          allocated). What validation would have refused is then the caller's
                          to rule out: a slot outside the pool is read as a row of zeros (never
                          from outside the pool, but it still takes a share of the softmax),
                          and indptrs that run past their tensors make the kernel read and write
                          past them.
        config:           "auto" (on H100/H200 when built for sm_90a wgmma-ws, or wgmma-ws-pipe
                          from 256 rows (tokens x heads) a request on average; else by the device's
                          shared memory), "wgmma-ws" (sm_90a, warp-specialized: one warpgroup for
                          S with Q in registers, two for P V; M=64, 48-key tiles, 3 stages, 181 KB
                          shared memory per block), "wgmma-ws-pipe" (the same with QK of the next
                          tile issued during the softmax of this one, Q's dims 320-575 in shared
                          memory, 213 KB: faster where the tile loop binds, slower where a call
                          streams its keys from DRAM), "wgmma" (sm_90a, two warpgroups: M=64, 64-key
                          tiles, 226 KB), "large" (mma.sync, M=64, 162 KB: sm_80/sm_90/sm_100),
                          "small" (mma.sync, M=48, 97 KB: sm_120) or "small-m32" (mma.sync, M=32,
                          89 KB: sm_120's shape for calls of few rows). On a part without the
                          shared memory for "large", "auto" takes "small-m32" or "small" per
                          call: the one whose busiest SM has less work as the plan lays the call
                          out (rows = tokens x heads, KV indices, the SM count; a row of M=32
                          weighs 1.2 rows of M=48, and M=48's fixed part 60 keys of its tile),
                          e.g. on 132 SMs M=32 for up to 32 rows and for 49-64 rows at any
                          length, for 33-48 rows up to ~13k keys, 128 rows up to ~40k, 256 rows
                          up to ~13k, 512 rows up to ~3.5k, 1024 rows up to ~1.8k, and 4096 rows
                          (128 tiles fill the GPU, 86 M=48 tiles do not); M=48 for the longer
                          calls of those row counts.
        num_sms:          the SM count the call is laid out for (its splits of the prefix, and
                          `auto`'s choice between "small" and "small-m32"), 1 to 1024; None (the
                          default) takes the device's own. Any value gives the same results to
                          rounding (the splits move, so the bits may differ); another box's count
                          runs that box's plan here, as the GPU tests do for sm_120 parts (188 SMs
                          on an RTX PRO 6000, 170 on an RTX 5090). More than the device has runs
                          the call in more than one wave; fewer leaves SMs idle.

    Returns:
        (out [N, H, 512] bf16, lse [N, H] fp32): lse is the natural log of each row's softmax
        denominator, for merging with other attention states.

    Every CTA plans its work from the indptrs (no planning launch, nothing on the host): a batch
    of B requests costs each of a CTA's 128-384 threads ~B / threads reads a pass of the plan's
    bisection, nothing at the batches of verify (B up to ~1k); at tens of thousands of requests
    the plan would dominate the call.

    No data-dependent allocation, and no host synchronisation once validation is off
    (``validate=False``, or while a CUDA graph is being captured): the call can be captured in a
    CUDA graph. The default ``validate=True`` copies the indptrs and the mask to the host first.
    Output is bitwise deterministic for identical inputs.
    """
    _check_tensors(
        q=q,
        kv_cache=kv_cache,
        kv_indices=kv_indices,
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        tree_mask=tree_mask,
        tree_mask_indptr=tree_mask_indptr,
    )
    for name, t in (("out", out), ("lse", lse)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be None or a torch.Tensor, got {type(t).__name__}")
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be True or False, got {validate!r}")
    config_id = _config_id(config)
    sms = _num_sms_arg(num_sms)
    scale = _sm_scale_arg(sm_scale)
    out, lse = load_extension().verify_attention(
        q,
        kv_cache,
        kv_indices,
        qo_indptr,
        kv_indptr,
        tree_mask,
        tree_mask_indptr,
        scale,
        out,
        lse,
        validate,
        config_id,
        sms,
    )
    return out, lse


def _check_tensors(**tensors: object) -> None:
    """Each argument a torch.Tensor, so that a list or an array is named here, not refused by
    the extension's generic signature error."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _sm_scale_arg(sm_scale: float) -> float:
    """``sm_scale`` as the extension takes it; its range is checked there."""
    if isinstance(sm_scale, torch.Tensor):
        raise TypeError(
            "sm_scale must be a Python number, got a tensor: reading it would copy it from the device "
            "(a sync, and an error while a CUDA graph is captured); pass float(sm_scale) once, outside the loop"
        )
    # A real number (numpy's too); not a bool, a string or bytes, which float() would also take.
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a number, got {sm_scale!r}")
    return float(sm_scale)


_CONFIGS = {"auto": 0, "large": 1, "small": 2, "wgmma": 3, "wgmma-ws": 4, "small-m32": 5, "wgmma-ws-pipe": 6}
_CONFIG_NAMES = {v: k for k, v in _CONFIGS.items()}


def _config_id(config: str) -> int:
    if config not in _CONFIGS:
        raise ValueError(f"config must be one of {sorted(_CONFIGS)}, got {config!r}")
    return _CONFIGS[config]


# The most SMs a call may be laid out for (kMaxPlanSms in csrc/binding.cpp).
MAX_NUM_SMS = 1024


def _num_sms_arg(num_sms: int | None) -> int:
    """The extension's form of ``num_sms``: 0 for the device's own count."""
    if num_sms is None:
        return 0
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or not 1 <= num_sms <= MAX_NUM_SMS:
        raise ValueError(f"num_sms must be None or an int from 1 to {MAX_NUM_SMS}, got {num_sms!r}")
    return num_sms


def planned_config(
    q: torch.Tensor,
    kv_indices: torch.Tensor,
    qo_indptr: torch.Tensor,
    config: str = "auto",
    num_sms: int | None = None,
) -> str:
    """The tile config that ``verify_attention`` runs for these inputs on their device: what
    ``config`` (default "auto") resolves to, from shapes only (no sync, nothing launched), for a
    call laid out for ``num_sms`` SMs as ``verify_attention`` takes it. Raises ValueError for an
    unknown name or a bad ``num_sms``, and RuntimeError when the device cannot run that config."""
    _check_tensors(q=q, kv_indices=kv_indices, qo_indptr=qo_indptr)
    config_id = _config_id(config)
    sms = _num_sms_arg(num_sms)
    if qo_indptr.dim() != 1 or qo_indptr.numel() < 2:
        raise ValueError(f"qo_indptr must be 1-D [B+1] with B >= 1, got {tuple(qo_indptr.shape)}")
    if not q.is_cuda or q.dim() != 3:
        raise ValueError(
            f"q must be a CUDA tensor [num_tokens, num_heads, 576], got {tuple(q.shape)} on {q.device}"
        )
    batch = qo_indptr.numel() - 1
    if q.shape[1] < 1 or q.shape[0] < batch:
        raise ValueError(
            f"q must have at least one head and a token per request of qo_indptr ({batch}), got {tuple(q.shape)}"
        )
    chosen = load_extension().planned_config(
        q.device.index if q.device.index is not None else torch.cuda.current_device(),
        batch,
        q.shape[0],
        q.shape[1],
        kv_indices.numel(),
        config_id,
        sms,
    )
    if chosen < 0:
        raise RuntimeError(f"config {config!r} cannot run on {q.device} (its shared memory or architecture)")
    return _CONFIG_NAMES[chosen]
