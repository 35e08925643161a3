"""One registry of implementations: the kernel (as `auto` picks its config, and with each of sm_120's
tile configs forced), the SGLang Triton baseline and the oracle.

Each entry has the same call signature. ``prepare(batch)`` does every conversion an entry
needs (tree packing, SGLang's mask layout, dtype casts) once, outside any timed region, and
returns a zero-argument callable that runs the operation and returns ``(out, lse)``:

    out [N, H, 512] (bf16 for GPU kernels, float64 for the oracle), lse [N, H] fp32/float64 or None

The callable may carry an ``impl_config`` attribute (a string: what it runs for this batch, e.g.
the kernel's tile config); sweeps copy it into their rows (:func:`impl_config_of`).

Parity and sweeps loop over :func:`implementations` and never special-case an entry.
An entry that cannot run here says why through ``availability(device)``; it is then
reported as ``unavailable`` with that reason, never as passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.batch import VerifyBatch

RunFn = Callable[[], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class Implementation:
    name: str
    description: str
    # (ok, reason): reason says why it cannot run on that device ("" when ok)
    availability: Callable[[torch.device], tuple[bool, str]]
    prepare: Callable[[VerifyBatch], RunFn]
    # devices it runs on: "cuda" for GPU kernels, "any" for the oracle
    device_kind: str = "cuda"
    # the oracle is the reference; speedups are reported against it
    is_reference: bool = False
    # whether its call returns lse (parity fails one that is registered so and returns None)
    returns_lse: bool = True


def impl_config_of(run_fn: RunFn) -> str:
    """What a prepared call says it runs (its ``impl_config`` attribute), "" when it says nothing."""
    value = getattr(run_fn, "impl_config", "")
    return value if isinstance(value, str) else ""


_REGISTRY: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    if impl.name in _REGISTRY:
        raise ValueError(f"implementation {impl.name!r} is registered twice")
    _REGISTRY[impl.name] = impl
    return impl


def _load_builtin() -> None:
    # Importing these modules registers their entries; each import is cheap and never
    # needs a GPU or sglang (those are checked in availability()).
    import harness.impl_kernel  # noqa: F401
    import harness.impl_oracle  # noqa: F401
    import harness.impl_sglang  # noqa: F401


def implementations() -> list[Implementation]:
    """All registered implementations, in a fixed order (kernel, baseline, oracle)."""
    _load_builtin()  # module imports run once, so each entry registers exactly once
    order = {"verify-attn-cuda": 0, "sglang-triton-ps1": 1, "oracle": 2}
    return sorted(_REGISTRY.values(), key=lambda i: (order.get(i.name, 99), i.name))


def get(name: str) -> Implementation:
    impls = {i.name: i for i in implementations()}
    if name not in impls:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(sorted(impls))}")
    return impls[name]
