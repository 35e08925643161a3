"""Mutation controls: wrong variants of the oracle that parity must catch, and one it must not.

Each mutant is the float64 oracle run on a deliberately broken view of the batch, modelling a
kernel bug; parity must fail each on at least one of the bundles smoke, ddtree and ragged:

    causal-mask        a causal mask instead of the tree (draft token i sees every j <= i)
    mask-bit-flip      one visibility bit cleared: draft token 1 no longer sees the root
    mask-shows-later   one visibility bit set: the root sees draft token 1, a later token
    drop-first-prefix  prefix token 0 (the sink) skipped
    drop-last-prefix   prefix token P-1 skipped
    split-skip         the prefix processed in splits of SPLIT keys, each split after the first
                       starting one key late (the boundary key is never seen)
    split-overlap      ... each split after the first starting one key early (counted twice)
    rope-ignored       scores over the 512 latent dims only
    wrong-sm-scale     1/sqrt(576) instead of the bundle's scale

The control's control, ``oracle-bf16``, rounds the oracle's output to bf16 (lse to fp32), the
error an honest bf16 kernel makes: it must pass every bundle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from harness import tree
from harness.batch import V_DIM, VerifyBatch
from harness.oracle import reference
from harness.registry import Implementation, RunFn

# A split size at which every bundle with a longer prefix has needles on both sides of the
# boundary (positions SPLIT - 1 and SPLIT).
SPLIT = 256


def _with_prefixes(batch: VerifyBatch, pick: Callable[[int], list[int]]) -> VerifyBatch:
    """The batch with request b's prefix replaced by positions ``pick(P_b)`` of its prefix."""
    indices, indptr, prefix_lens = [], [0], []
    kv = [int(x) for x in batch.kv_indptr.cpu()]
    for b, (p, parents) in enumerate(zip(batch.prefix_lens, batch.parents, strict=True)):
        keys = batch.kv_indices[kv[b] : kv[b + 1]]
        positions = torch.tensor(pick(p) + list(range(p, p + len(parents))), dtype=torch.long)
        indices.append(keys[positions.to(keys.device)])
        prefix_lens.append(len(positions) - len(parents))
        indptr.append(indptr[-1] + len(positions))
    return replace(
        batch,
        kv_indices=torch.cat(indices),
        kv_indptr=torch.tensor(indptr, dtype=torch.int32, device=batch.kv_indptr.device),
        prefix_lens=tuple(prefix_lens),
    )


def _split_positions(p: int, shift: int) -> list[int]:
    """Prefix positions read by splits of SPLIT keys whose starts (after the first) move by ``shift``."""
    positions: list[int] = []
    for start in range(0, p, SPLIT):
        first = start + shift if start else 0
        positions += range(max(first, 0), min(start + SPLIT, p))
    return positions


def _flipped_visibility(batch: VerifyBatch, bit: tuple[int, int] = (1, 0)) -> list[torch.Tensor]:
    """Every request's visibility, the first one of two tokens or more with ``bit`` (row, column)
    toggled: (1, 0) hides the root from node 1 (its parent, always), (0, 1) shows node 1 to the
    root (a later token, never visible)."""
    vis = [tree.visibility(p) for p in batch.parents]
    target = next((b for b, v in enumerate(vis) if v.shape[0] >= 2), None)
    if target is not None:
        vis[target][bit] = not bool(vis[target][bit])
    return vis


def _no_rope(batch: VerifyBatch) -> VerifyBatch:
    q = batch.q.clone()
    q[..., V_DIM:] = 0
    return replace(batch, q=q)


MUTANTS: dict[str, tuple[str, Callable[[VerifyBatch], tuple[torch.Tensor, torch.Tensor]]]] = {
    "causal-mask": (
        "a causal mask instead of the tree mask",
        lambda b: reference(replace(b, parents=tuple(tree.chain(len(p)) for p in b.parents))),
    ),
    "mask-bit-flip": (
        "one mask bit cleared: draft token 1 does not see the root",
        lambda b: reference(b, visibility=_flipped_visibility(b)),
    ),
    "mask-shows-later": (
        "one mask bit set: the root sees draft token 1, a later token",
        lambda b: reference(b, visibility=_flipped_visibility(b, (0, 1))),
    ),
    "drop-first-prefix": (
        "prefix token 0 skipped",
        lambda b: reference(_with_prefixes(b, lambda p: list(range(1, p)))),
    ),
    "drop-last-prefix": (
        "prefix token P-1 skipped",
        lambda b: reference(_with_prefixes(b, lambda p: list(range(p - 1)))),
    ),
    "split-skip": (
        f"splits of {SPLIT} keys, each later split starting one key late",
        lambda b: reference(_with_prefixes(b, lambda p: _split_positions(p, +1))),
    ),
    "split-overlap": (
        f"splits of {SPLIT} keys, each later split starting one key early",
        lambda b: reference(_with_prefixes(b, lambda p: _split_positions(p, -1))),
    ),
    "rope-ignored": ("scores over the 512 latent dims only", lambda b: reference(_no_rope(b))),
    "wrong-sm-scale": (
        "sm_scale = 1/sqrt(576)",
        lambda b: reference(replace(b, sm_scale=1 / math.sqrt(576))),
    ),
}


def _available(device: torch.device) -> tuple[bool, str]:
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, ""


def _entry(
    name: str, description: str, run: Callable[[VerifyBatch], tuple[torch.Tensor, torch.Tensor]]
) -> Implementation:
    def prepare(batch: VerifyBatch) -> RunFn:
        return lambda: run(batch)

    return Implementation(
        name=name, description=description, availability=_available, prepare=prepare, device_kind="any"
    )


def mutants() -> list[Implementation]:
    """The mutants as registry-shaped entries named ``mutant:<name>`` (not registered: parity
    runs them only on request, and expects each to fail)."""
    return [_entry(f"mutant:{name}", desc, run) for name, (desc, run) in MUTANTS.items()]


def _rounded_oracle(batch: VerifyBatch) -> tuple[torch.Tensor, torch.Tensor]:
    # Computed in float32 (an honest kernel accumulates in fp32), not the goldens' float64 rounded
    # afterwards: then its lse would be the goldens' own and never test the lse tolerance.
    out, lse = reference(batch, dtype=torch.float32)
    return out.to(torch.bfloat16), lse


def control() -> Implementation:
    """``control:oracle-bf16``: the oracle in float32, its output rounded to bf16 as a bf16
    kernel's; must pass everywhere."""
    return _entry(
        "control:oracle-bf16",
        "the oracle in float32, its output rounded to bf16 (lse in fp32)",
        _rounded_oracle,
    )
