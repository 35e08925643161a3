"""The "SGLang Triton page_size=1" baseline: SGLang's own ``extend_attention_fwd``.

This is the kernel SGLang's ``TritonAttnBackend.forward_extend`` runs for MLA target-verify
on CUDA. :func:`sglang_verify_args` turns a :class:`VerifyBatch` into exactly the arguments
the backend passes there:

    q_extend     [N, H, 576]     the draft tokens' queries
    k_extend     [N, 1, 576]     the draft tokens' KV rows (the backend has just written them
                                 to the pool at ``out_cache_loc``)
    v_extend     [N, 1, 512]     their first 512 dims, contiguous
    o_extend     [N, H, 512]
    k_buffer     [S, 1, 576]     the pool
    v_buffer     [S, 1, 512]     the same storage, viewed as [..., :512]
    qo_indptr    [B+1]  int32
    kv_indptr    [B+1]  int32    cumsum of the prefix lengths (prefix only)
    kv_indices   [sum P] int64   the prefix slots
    custom_mask  [sum T*(P+T)] bool, per request a row-major T x (P+T) block: column P+j is
                                 visible to row i iff draft j is i or an ancestor of i; the
                                 prefix columns are all True
    mask_indptr  [B+1]  int64    cumsum of T*(P+T)
    is_causal=True (parents precede children), k_scale = v_scale = 1.0, the batch's sm_scale
    (the kernel's default 1/sqrt(576) is wrong for MLA), max_len_extend = max T.

The kernel gives no lse here (the backend does not ask for one), so the entry returns
``(out, None)``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch

from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.registry import Implementation, RunFn, register
from harness.tree import custom_mask_from_parents

NAME = "sglang-triton-ps1"

# Where extend_attention_fwd lives: sglang 0.5.23's path first, then the older releases'.
KERNEL_MODULES = (
    "sglang.kernels.ops.attention.extend_attention",
    "sglang.srt.layers.attention.triton_ops.extend_attention",
)

# The parameters the MLA target-verify call passes. Releases before these existed took
# another layout (req_to_tokens), which this baseline does not drive.
KERNEL_PARAMS = (
    "q_extend",
    "k_extend",
    "v_extend",
    "o_extend",
    "k_buffer",
    "v_buffer",
    "qo_indptr",
    "kv_indptr",
    "kv_indices",
    "custom_mask",
    "is_causal",
    "mask_indptr",
    "max_len_extend",
    "k_scale",
    "v_scale",
    "sm_scale",
)


@dataclass(frozen=True)
class SglangKernel:
    extend_attention_fwd: Callable[..., object]
    module: str
    version: str
    # Triton decides at decoration time, i.e. when sglang's module is imported, whether its
    # kernels run in the interpreter; TRITON_INTERPRET set later changes nothing.
    interpreted: bool


@dataclass(frozen=True)
class SglangVerifyArgs:
    """What ``TritonAttnBackend.forward_extend`` holds for an MLA verify step (module docstring)."""

    q_extend: torch.Tensor  # [N, H, 576]
    k_extend: torch.Tensor  # [N, 1, 576]
    v_extend: torch.Tensor  # [N, 1, 512] contiguous
    k_buffer: torch.Tensor  # [S, 1, 576]
    v_buffer: torch.Tensor  # [S, 1, 512] view of k_buffer
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32, prefix only
    kv_indices: torch.Tensor  # [sum P] int64, prefix slots
    custom_mask: torch.Tensor  # [sum T*(P+T)] bool
    mask_indptr: torch.Tensor  # [B+1] int64
    out_cache_loc: torch.Tensor  # [N] int64, the draft tokens' slots
    max_len_extend: int
    sm_scale: float

    def kernel_kwargs(self, o_extend: torch.Tensor) -> dict[str, object]:
        """Keyword arguments of ``extend_attention_fwd`` for this step, writing ``o_extend``."""
        return {
            "q_extend": self.q_extend,
            "k_extend": self.k_extend,
            "v_extend": self.v_extend,
            "o_extend": o_extend,
            "k_buffer": self.k_buffer,
            "v_buffer": self.v_buffer,
            "qo_indptr": self.qo_indptr,
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "custom_mask": self.custom_mask,
            "is_causal": True,
            "mask_indptr": self.mask_indptr,
            "max_len_extend": self.max_len_extend,
            "k_scale": 1.0,
            "v_scale": 1.0,
            "sm_scale": self.sm_scale,
        }


def sglang_verify_args(batch: VerifyBatch) -> SglangVerifyArgs:
    """The arguments SGLang's Triton backend passes for this verify step (module docstring)."""
    if batch.q.dtype != batch.kv_cache.dtype:
        raise ValueError(
            f"q is {batch.q.dtype} but kv_cache is {batch.kv_cache.dtype}; the kernel takes one dtype"
        )
    _, kv = batch.host_indptrs()
    device = batch.device
    prefix_pos = [torch.arange(kv[b], kv[b] + p) for b, p in enumerate(batch.prefix_lens)]
    draft_pos = [torch.arange(kv[b] + p, kv[b + 1]) for b, p in enumerate(batch.prefix_lens)]
    slots = batch.kv_indices.to(torch.int64)
    kv_indices = slots[torch.cat(prefix_pos).to(device)]
    out_cache_loc = slots[torch.cat(draft_pos).to(device)]

    # A view, not a copy: the backend's pool is one [S, 1, 576] buffer read as both K and V.
    k_buffer = batch.kv_cache.view(-1, 1, QK_DIM)
    k_extend = k_buffer[out_cache_loc]
    custom_mask, mask_indptr = custom_mask_from_parents(batch.parents, batch.prefix_lens)
    return SglangVerifyArgs(
        q_extend=batch.q.contiguous(),
        k_extend=k_extend,
        v_extend=k_extend[..., :V_DIM].contiguous(),
        k_buffer=k_buffer,
        v_buffer=k_buffer[..., :V_DIM],
        qo_indptr=batch.qo_indptr.to(torch.int32),
        kv_indptr=torch.tensor([0, *accumulate(batch.prefix_lens)], dtype=torch.int32, device=device),
        kv_indices=kv_indices,
        custom_mask=custom_mask.to(device),
        mask_indptr=mask_indptr.to(device),
        out_cache_loc=out_cache_loc,
        max_len_extend=max(batch.num_draft),
        sm_scale=batch.sm_scale,
    )


def _import_kernel() -> SglangKernel:
    errors = []
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            # Only "this release has no such module" moves on to the older path; a missing
            # dependency of an existing module is the reason to report.
            if e.name is not None and e.name.startswith("sglang.") and f"{name}.".startswith(f"{e.name}."):
                errors.append(f"{name}: {e}")
                continue
            raise
        fn = module.extend_attention_fwd
        missing = [p for p in KERNEL_PARAMS if p not in inspect.signature(fn).parameters]
        if missing:
            raise ImportError(f"{name}.extend_attention_fwd has no parameter(s) {', '.join(missing)}")
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:  # imported from a source tree
            version = "unknown"
        return SglangKernel(
            extend_attention_fwd=fn,
            module=name,
            version=version,
            interpreted=os.environ.get("TRITON_INTERPRET") == "1",
        )
    raise ImportError("; ".join(errors))


@functools.cache
def load_kernel() -> SglangKernel | str:
    """sglang's ``extend_attention_fwd``, or why it cannot be imported (cached either way)."""
    env_before = dict(os.environ)
    try:
        return _import_kernel()
    except Exception as e:  # any failure to import the baseline makes it unavailable, with this reason
        return f"{type(e).__name__}: {e}"
    finally:
        # Importing sglang points TRITON_CACHE_DIR, CUDA_CACHE_PATH and others at its own cache
        # folder for the whole process; undo that so no other entry's behaviour depends on
        # whether the baseline was loaded first.
        for key in set(os.environ) - set(env_before):
            del os.environ[key]


def availability(device: torch.device | str) -> tuple[bool, str]:
    device = torch.device(device)
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return (
            False,
            "sglang's Triton kernel needs a CUDA device (Triton's interpreter computes bf16 dot products "
            "wrongly, so it is no stand-in for the bf16 bundles and sweeps)",
        )
    if device.type not in ("cpu", "cuda"):
        return (
            False,
            f"sglang's Triton kernel runs on cuda (or cpu under the Triton interpreter), not {device.type}",
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        return False, "no CUDA device: torch.cuda.is_available() is False"
    loaded = load_kernel()
    if isinstance(loaded, str):
        return False, loaded
    if device.type == "cpu" and not loaded.interpreted:
        return (
            False,
            "sglang was imported before TRITON_INTERPRET=1 was set, so its kernels are compiled for CUDA",
        )
    return True, ""


def prepare(batch: VerifyBatch) -> RunFn:
    loaded = load_kernel()
    if isinstance(loaded, str):
        raise RuntimeError(f"{NAME} is unavailable: {loaded}")
    if loaded.interpreted and batch.q.dtype == torch.bfloat16:
        # Triton's interpreter gives bf16 tl.dot results off by ~1e9 relative (triton 3.9,
        # tests/test_sglang_baseline.py): an error, not a parity row that blames the baseline.
        raise RuntimeError(
            f"{NAME} under TRITON_INTERPRET=1 cannot run bf16 inputs: the interpreter computes bf16 dot "
            "products wrongly; run it on a CUDA device (the interpreter is only for fp16 checks)"
        )
    args = sglang_verify_args(batch)
    n, h = args.q_extend.shape[:2]
    fwd = loaded.extend_attention_fwd

    first = [True]

    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        # A fresh output per call, as the backend allocates one per layer: two calls then
        # return two results, never one buffer seen twice. The first call's (parity's only one,
        # a sweep's warm-up) is NaN-filled, so that rows the call leaves unwritten fail parity
        # instead of showing what the allocator's block held: the previous implementation's
        # freed output, of the same size. Timed calls allocate as the backend does.
        o_extend = args.q_extend.new_empty((n, h, V_DIM))
        if first[0]:
            o_extend.fill_(float("nan"))
            first[0] = False
        fwd(**args.kernel_kwargs(o_extend))
        return o_extend, None

    return run


SGLANG_TRITON = register(
    Implementation(
        name=NAME,
        description="SGLang's Triton extend_attention_fwd (page_size=1), as its backend runs MLA target-verify",
        availability=availability,
        prepare=prepare,
        device_kind="cuda",
        returns_lse=False,  # extend_attention_fwd writes no lse
    )
)
