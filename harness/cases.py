"""Synthetic sweep cases: a few parameters -> a :class:`VerifyBatch` built on the device.

A case is ``batch_size`` requests, each with ``prefix_len`` prefix tokens and a draft tree of
``tree_size`` nodes (kind ``tree``: chain, eagle, ddtree or random, from :mod:`harness.tree`),
``num_heads`` heads. Its id reads ``B1-P65536-T16-H8-shuffled``; a tree kind other than the
default eagle tree is appended (``...-shuffled-chain``), except for ``T1`` where every kind is the
same single node.

Layouts (page_size=1):
    contiguous  request b's KV rows are consecutive pool slots, in order;
    shuffled    every row sits in a random slot of the pool (a seeded permutation), the layout
                a page_size=1 cache reaches after a while of serving.

q and the pool are random normal bf16 drawn on the device from a seeded generator, so a case
builds in milliseconds even at 256k tokens; timing does not depend on the values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from harness import tree
from harness.batch import QK_DIM, VerifyBatch

LAYOUTS = ("contiguous", "shuffled")
TREE_KINDS = ("chain", "eagle", "ddtree", "random")
DEFAULT_TREE = "eagle"
# DeepSeek-V3's MLA softmax scale: 1 / sqrt(128 nope + 64 RoPE dims of the unabsorbed head).
SM_SCALE = 1 / math.sqrt(192)  # DeepSeek-V3: qk head dim 128 + 64, as in the bundles


# The largest tree each kind can build (tree.eagle_tree raises above it: 457 nodes); kinds not
# named have no limit a case could reach (ddtree's, 8 children a node over 16 depths, is beyond
# any batch that fits in memory).
MAX_TREE_SIZE = {"eagle": tree.EAGLE_MAX_NODES}


def _tree_builders() -> dict[str, Callable[[int, int], Sequence[int]]]:
    return {
        "chain": lambda size, seed: tree.chain(size),
        "eagle": tree.eagle_tree,
        "ddtree": tree.ddtree,
        "random": tree.random_tree,
    }


@dataclass(frozen=True)
class CaseParams:
    batch_size: int
    prefix_len: int
    num_heads: int
    tree_size: int
    tree: str = DEFAULT_TREE
    layout: str = "shuffled"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_heads", "tree_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"case: {name} must be >= 1, got {getattr(self, name)}")
        if self.prefix_len < 0:
            raise ValueError(f"case: prefix_len must be >= 0, got {self.prefix_len}")
        if self.tree not in TREE_KINDS:
            raise ValueError(f"case: tree must be one of {', '.join(TREE_KINDS)}, got {self.tree!r}")
        # refused when the case is made (as a grid is read), not when a sweep reaches it
        limit = MAX_TREE_SIZE.get(self.tree)
        if limit is not None and self.tree_size > limit:
            raise ValueError(
                f"case: tree_size must be <= {limit} with tree {self.tree!r} (the most nodes that "
                f"kind of tree has), got {self.tree_size}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"case: layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")

    @property
    def case_id(self) -> str:
        cid = f"B{self.batch_size}-P{self.prefix_len}-T{self.tree_size}-H{self.num_heads}-{self.layout}"
        if self.tree != DEFAULT_TREE and self.tree_size > 1:
            cid += f"-{self.tree}"
        return cid

    @property
    def kv_rows(self) -> int:
        return self.batch_size * (self.prefix_len + self.tree_size)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parents_of(params: CaseParams) -> tuple[tuple[int, ...], ...]:
    """The draft tree of each request (seeded per request, so requests differ)."""
    build = _tree_builders()[params.tree]
    out = []
    for b in range(params.batch_size):
        parents = tuple(int(p) for p in build(params.tree_size, params.seed + b))
        if len(parents) != params.tree_size:
            raise ValueError(
                f"case {params.case_id}: the {params.tree} tree builder returned {len(parents)} nodes, "
                f"expected tree_size={params.tree_size}"
            )
        out.append(parents)
    return tuple(out)


def build_batch(params: CaseParams, device: torch.device | str, *, input_set: int = 0) -> VerifyBatch:
    """The case's batch on ``device``. ``input_set`` picks another draw of q, pool and layout
    with the same shapes and trees (input rotation for a cold L2)."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(params.seed * 1_000_003 + input_set)
    b, p, t, h = params.batch_size, params.prefix_len, params.tree_size, params.num_heads
    rows = params.kv_rows
    q = torch.randn(b * t, h, QK_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    kv_cache = torch.randn(rows, QK_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    if params.layout == "shuffled":
        kv_indices = torch.randperm(rows, generator=gen, device=device).to(torch.int32)
    else:
        kv_indices = torch.arange(rows, device=device, dtype=torch.int32)
    step = torch.arange(b + 1, device=device, dtype=torch.int32)
    return VerifyBatch(
        q=q,
        kv_cache=kv_cache,
        kv_indices=kv_indices,
        qo_indptr=step * t,
        kv_indptr=step * (p + t),
        prefix_lens=(p,) * b,
        parents=parents_of(params),
        sm_scale=SM_SCALE,
    )
