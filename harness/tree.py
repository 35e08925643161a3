"""Draft trees: parent arrays, visibility matrices, SGLang's ``custom_mask``, seeded builders.

A draft tree of ``T`` nodes is a parent array: ``parents[0] == -1`` (node 0, the root, is the
last verified token) and ``0 <= parents[i] < i`` for every other node, so a parent always
precedes its child. Draft token ``i`` sees itself and its ancestors::

    visibility [T, T] bool   visibility[i, j] is True iff j == i or j is an ancestor of i

SGLang passes the same information as a flat ``custom_mask``: per request b a row-major
``T_b x (P_b + T_b)`` bool block starting at ``mask_indptr[b]``; column ``P_b + j`` of row ``i``
is True iff draft token ``i`` sees draft token ``j``, and every prefix column is True.

The builders return ``tuple[int, ...]`` parent arrays and are deterministic: each draws from
``numpy.random.Generator(PCG64(seed))`` only (the tree is stored in a bundle anyway).
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Sequence

import numpy as np
import torch

from kernel.tree_mask import node_index, visibility_from_parents

__all__ = [
    "validate_parents",
    "visibility",
    "parents_from_visibility",
    "custom_mask_from_parents",
    "visibility_from_custom_mask",
    "children",
    "chain",
    "ddtree",
    "eagle_tree",
    "random_tree",
]


def validate_parents(parents: Sequence[int], field: str = "parents") -> tuple[int, ...]:
    """The parent array as a tuple of ints; raises naming ``field`` and the first bad entry."""
    if isinstance(parents, (str, bytes)) or not isinstance(parents, (Sequence, torch.Tensor, np.ndarray)):
        raise ValueError(f"{field} must be a sequence of parent indices, got {type(parents).__name__}")
    out = tuple(node_index(p, field, i) for i, p in enumerate(parents))
    if not out:
        raise ValueError(f"{field} is empty; a draft tree has at least its root (node 0)")
    if out[0] != -1:
        raise ValueError(f"{field}[0] = {out[0]}; the root (node 0) must have parent -1")
    for i, p in enumerate(out[1:], start=1):
        if p >= i:
            raise ValueError(f"{field}[{i}] = {p} comes after node {i}; a parent must precede its child")
        if p < 0:
            raise ValueError(
                f"{field}[{i}] = {p}; only the root (node 0) has no parent, expected 0 <= p < {i}"
            )
    return out


def visibility(parents: Sequence[int], field: str = "parents") -> torch.Tensor:
    """[T, T] bool visibility of a validated tree (self + ancestors), on the CPU."""
    return visibility_from_parents(validate_parents(parents, field))


def parents_from_visibility(vis: torch.Tensor, field: str = "visibility") -> tuple[int, ...]:
    """The parent array whose visibility is ``vis``; raises if ``vis`` is not a tree's visibility.

    The parent of ``i`` is the visible node with the largest index below ``i``: every other
    ancestor is an ancestor of that parent, so it has a smaller index.
    """
    if vis.dim() != 2 or vis.shape[0] != vis.shape[1] or vis.shape[0] < 1:
        raise ValueError(f"{field} must be a non-empty square [T, T] matrix, got shape {tuple(vis.shape)}")
    vis = vis.to(torch.bool).cpu()
    parents = []
    for i in range(vis.shape[0]):
        below = torch.nonzero(vis[i, :i]).flatten()
        parents.append(int(below[-1]) if below.numel() else -1)
    if parents[0] != -1 or any(p == -1 for p in parents[1:]):
        orphan = next(i for i, p in enumerate(parents) if p == -1 and i > 0)
        raise ValueError(
            f"{field} row {orphan} sees no earlier node; only the root (node 0) may have no parent"
        )
    expected = visibility_from_parents(parents)
    if not torch.equal(vis, expected):
        i, j = (int(x) for x in torch.nonzero(vis != expected)[0])
        raise ValueError(
            f"{field}[{i}, {j}] = {bool(vis[i, j])} but a tree with parents {tuple(parents)} gives "
            f"{bool(expected[i, j])}: row i must see exactly itself and its ancestors"
        )
    return tuple(parents)


def custom_mask_from_parents(
    parents: Sequence[Sequence[int]], prefix_lens: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's (custom_mask [sum_b T_b * (P_b + T_b)] bool, mask_indptr [B + 1] int64) on the CPU."""
    if len(parents) != len(prefix_lens):
        raise ValueError(f"parents has {len(parents)} trees but prefix_lens has {len(prefix_lens)} entries")
    blocks, indptr = [torch.zeros(0, dtype=torch.bool)], [0]
    for b, (tree, p) in enumerate(zip(parents, prefix_lens, strict=True)):
        p = _count(p, f"prefix_lens[{b}]", 0)
        vis = visibility(tree, f"parents[{b}]")
        t = vis.shape[0]
        block = torch.ones(t, p + t, dtype=torch.bool)
        block[:, p:] = vis
        blocks.append(block.reshape(-1))
        indptr.append(indptr[-1] + t * (p + t))
    return torch.cat(blocks), torch.tensor(indptr, dtype=torch.int64)


def _count(value: object, field: str, least: int) -> int:
    """``value`` as an int >= ``least`` (numpy and 0-d torch integers too); raises naming ``field``."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{field} = {value!r}: expected an int >= {least}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{field} = {value!r}: expected an int >= {least}") from None
    if n < least:
        raise ValueError(f"{field} = {n}; expected >= {least}")
    return n


def visibility_from_custom_mask(
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    prefix_lens: Sequence[int],
    num_draft: Sequence[int],
) -> list[torch.Tensor]:
    """Per request the [T_b, T_b] draft visibility held in SGLang's flat ``custom_mask``.

    Raises if a block is not where ``mask_indptr`` says or if any prefix column is False
    (every draft token must see the whole prefix).
    """
    if custom_mask.dim() != 1:
        raise ValueError(f"custom_mask must be 1-D, got shape {tuple(custom_mask.shape)}")
    if len(prefix_lens) != len(num_draft) or mask_indptr.numel() != len(prefix_lens) + 1:
        raise ValueError(
            f"mask_indptr has {mask_indptr.numel()} entries, prefix_lens {len(prefix_lens)} and num_draft "
            f"{len(num_draft)}; expected B + 1, B and B"
        )
    if mask_indptr.dim() != 1 or mask_indptr.is_floating_point() or mask_indptr.dtype == torch.bool:
        raise ValueError(
            f"mask_indptr must be a 1-D integer tensor, got {mask_indptr.dtype} {tuple(mask_indptr.shape)}"
        )
    mask = custom_mask.to(torch.bool).cpu()
    indptr = [int(x) for x in mask_indptr.cpu()]
    if indptr[0] < 0:
        raise ValueError(f"mask_indptr[0] = {indptr[0]}; expected >= 0 (an offset into custom_mask)")
    out = []
    for b, (p, t) in enumerate(zip(prefix_lens, num_draft, strict=True)):
        p = _count(p, f"prefix_lens[{b}]", 0)
        t = _count(t, f"num_draft[{b}]", 1)
        size = t * (p + t)
        if indptr[b + 1] - indptr[b] != size:
            raise ValueError(
                f"mask_indptr[{b + 1}] - mask_indptr[{b}] = {indptr[b + 1] - indptr[b]}, expected "
                f"T * (P + T) = {t} * ({p} + {t}) = {size} for request {b}"
            )
        if indptr[b + 1] > mask.numel():
            raise ValueError(
                f"mask_indptr[{b + 1}] = {indptr[b + 1]} is past the end of custom_mask ({mask.numel()})"
            )
        block = mask[indptr[b] : indptr[b + 1]].view(t, p + t)
        if not bool(block[:, :p].all()):
            i, j = (int(x) for x in torch.nonzero(~block[:, :p])[0])
            raise ValueError(f"custom_mask of request {b}: draft token {i} does not see prefix token {j}")
        out.append(block[:, p:].clone())
    return out


def children(parents: Sequence[int]) -> list[list[int]]:
    """Per node its children, in index order."""
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def _check_size(num_draft: int) -> None:
    if num_draft < 1:
        raise ValueError(f"num_draft = {num_draft}; a draft tree has at least its root, expected >= 1")


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def chain(num_draft: int) -> tuple[int, ...]:
    """A single draft sequence: node i's parent is i - 1 (a causal mask)."""
    _check_size(num_draft)
    return tuple(range(-1, num_draft - 1))


def _best_first(num_draft: int, depth_probs: list[np.ndarray], branch: int) -> tuple[int, ...]:
    """Grow a tree from the root best-first by path probability under a node budget.

    ``depth_probs[d]`` are the candidate probabilities (descending) of a child at depth d + 1;
    each node offers its ``branch`` most likely children. Nodes are numbered in the order they
    are taken, so parents precede children.
    """
    parents = [-1]
    # (-path probability, order of insertion, parent node, depth of the child, rank among siblings)
    heap: list[tuple[float, int, int, int, int]] = []
    counter = 0

    def offer(node: int, log_prob: float, depth: int) -> None:
        nonlocal counter
        if depth >= len(depth_probs):
            return
        for rank in range(min(branch, len(depth_probs[depth]))):
            heapq.heappush(heap, (-(log_prob + np.log(depth_probs[depth][rank])), counter, node, depth, rank))
            counter += 1

    offer(0, 0.0, 0)
    while len(parents) < num_draft and heap:
        neg, _, parent, depth, _ = heapq.heappop(heap)
        parents.append(parent)
        offer(len(parents) - 1, -neg, depth + 1)
    return tuple(parents)


def ddtree(num_draft: int, seed: int) -> tuple[int, ...]:
    """A DDTree-like tree: best-first over per-position token distributions of a block drafter.

    A block diffusion drafter predicts every position of the next block at once, so each depth
    has one distribution independent of the path; the tree takes the ``num_draft - 1`` most
    likely continuations under the product of those marginals (a wide, shallow-to-medium tree).
    """
    _check_size(num_draft)
    rng = _rng(seed)
    block = 16
    # Peaked marginals, flatter with depth: the drafter is less sure further ahead.
    depth_probs = []
    for d in range(block):
        logits = rng.standard_normal(8) * (3.0 - 2.0 * d / block)
        probs = np.sort(np.exp(logits - logits.max()))[::-1]
        depth_probs.append(probs / probs.sum())
    return _best_first(num_draft, depth_probs, branch=8)


# EAGLE-2's defaults are top-k 8 over 6-8 steps; 8 x 8 also covers trees of 256+ nodes.
EAGLE_TOP_K, EAGLE_DEPTHS = 8, 8
# The root, its top k children, then k frontier nodes expanded into k children at each later depth.
EAGLE_MAX_NODES = 1 + EAGLE_TOP_K + (EAGLE_DEPTHS - 1) * EAGLE_TOP_K * EAGLE_TOP_K


def eagle_tree(num_draft: int, seed: int) -> tuple[int, ...]:
    """An EAGLE-2-like tree: top-k expansion over several depths, then the best nodes overall.

    Each depth expands the ``k`` most likely frontier nodes with their ``k`` most likely
    children (path-dependent probabilities); the tree keeps the ``num_draft - 1`` candidates
    with the highest path probability, which is closed under taking ancestors because a path's
    probability only falls along it.
    """
    _check_size(num_draft)
    rng = _rng(seed)
    k, depths = EAGLE_TOP_K, EAGLE_DEPTHS
    # candidate: (log path probability, depth, parent candidate id); id 0 is the root
    cands: list[tuple[float, int, int]] = [(0.0, 0, -1)]
    frontier = [0]
    for depth in range(1, depths + 1):
        new = []
        for node in frontier:
            logits = rng.standard_normal(k) * 2.0
            probs = np.sort(np.exp(logits - logits.max()))[::-1]
            probs = probs / (probs.sum() + np.exp(rng.standard_normal()))  # the unexpanded tail
            for pr in probs:
                cands.append((cands[node][0] + float(np.log(pr)), depth, node))
                new.append(len(cands) - 1)
        frontier = sorted(new, key=lambda c: -cands[c][0])[:k]
    keep = sorted(range(1, len(cands)), key=lambda c: (-cands[c][0], c))[: num_draft - 1]
    if len(keep) < num_draft - 1:
        raise ValueError(
            f"eagle_tree: num_draft = {num_draft} exceeds the {len(cands)} candidates of the expansion"
        )
    # Number by depth, then by path probability, so that parents precede children.
    order = [0, *sorted(keep, key=lambda c: (cands[c][1], -cands[c][0], c))]
    index = {c: i for i, c in enumerate(order)}
    return tuple(-1 if c == 0 else index[cands[c][2]] for c in order)


def random_tree(num_draft: int, seed: int) -> tuple[int, ...]:
    """Every node's parent drawn uniformly from the nodes before it (deep and bushy shapes)."""
    _check_size(num_draft)
    rng = _rng(seed)
    return (-1, *(int(rng.integers(0, i)) for i in range(1, num_draft)))
