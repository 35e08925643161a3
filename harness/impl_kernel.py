"""Registry entry for this project's CUDA kernel ("verify-attn-cuda")."""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

import torch

from harness.batch import V_DIM, VerifyBatch
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


def kernel_call(module: ModuleType, batch: VerifyBatch, config: str | None = None) -> RunFn:
    """A zero-argument call of ``module.verify_attention`` on ``batch``: the tree is packed and
    the outputs allocated once, one validated call is made up front (bad inputs fail here with a
    named argument, not in a timed loop), and the returned call skips the host-side checks.

    ``module`` is this checkout's ``kernel`` package or another revision's (an A/B run), so the
    call passes only the keywords that revision's ``verify_attention`` accepts: an older one may
    lack ``out``/``lse``/``validate``/``config``.
    """
    tree_mask, tree_mask_indptr = module.pack_parents(batch.parents)
    args = (
        batch.q,
        batch.kv_cache,
        batch.kv_indices,
        batch.qo_indptr,
        batch.kv_indptr,
        tree_mask.to(batch.device),
        tree_mask_indptr.to(batch.device),
        batch.sm_scale,
    )
    accepted = inspect.signature(module.verify_attention).parameters
    kwargs: dict[str, Any] = {}
    if "out" in accepted and "lse" in accepted:
        n, h = batch.q.shape[0], batch.num_heads
        kwargs["out"] = torch.empty(n, h, V_DIM, dtype=torch.bfloat16, device=batch.device)
        kwargs["lse"] = torch.empty(n, h, dtype=torch.float32, device=batch.device)
    if config is not None:
        if "config" not in accepted:
            raise ValueError(f"this kernel revision has no config option (asked for config={config!r})")
        kwargs["config"] = config
    module.verify_attention(*args, **kwargs)  # validates with the revision's defaults
    if "validate" in accepted:
        kwargs["validate"] = False
    if "out" in kwargs:
        # What parity checks must come from the call returned below, the unvalidated one that a
        # serving loop or a graph runs, not from the validated call above: a path that wrote
        # nothing would otherwise pass on its values.
        kwargs["out"].fill_(float("nan"))
        kwargs["lse"].fill_(float("nan"))

    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        return module.verify_attention(*args, **kwargs)

    # The tile config this call runs (an older revision in an A/B may not say).
    planned = getattr(module, "planned_config", None)
    if planned is not None:
        run.impl_config = planned(batch.q, batch.kv_indices, batch.qo_indptr, config or "auto")  # type: ignore[attr-defined]
    return run


def prepare(batch: VerifyBatch, config: str = "auto") -> RunFn:
    """This checkout's kernel on ``batch`` (see :func:`kernel_call`)."""
    import kernel

    return kernel_call(kernel, batch, config)


register(
    Implementation(
        name=NAME,
        description=(
            "this project's kernel: split-K over the prefix, shared KV tiles, bf16 tensor cores "
            "(wgmma on H100/H200, mma.sync elsewhere; config='auto')"
        ),
        availability=_availability,
        prepare=prepare,
        device_kind="cuda",
    )
)

# sm_120's tile configs (the mma.sync kernels `auto` picks on a 99 KB part) forced, so that any GPU
# that holds them (an H100/H200 runs wgmma-ws under `auto`) checks their parity and times them: the
# `sm120` grid names these, parity runs every registered entry.
FORCED_CONFIGS = ("small", "small-m32")
for _config in FORCED_CONFIGS:
    register(
        Implementation(
            name=f"{NAME}-{_config}",
            description=f"this project's kernel with config={_config!r} forced (sm_120's path, on any GPU)",
            availability=_availability,
            prepare=functools.partial(prepare, config=_config),
            device_kind="cuda",
        )
    )
