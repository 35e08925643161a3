"""Packed tree visibility, the kernel's mask format.

Per request b a block of ``T_b`` rows x ``words_per_row(T_b)`` int32 words starts at word
``tree_mask_indptr[b]``; bit ``k`` of word ``w`` in row ``i`` is 1 iff draft token ``i`` sees draft
token ``32 * w + k`` (itself and its ancestors, for a tree). Rows are padded to whole words so the
kernel reads one word per (row, 32 keys) without a division by T.

    tree_mask        [sum_b T_b * words_per_row(T_b)]  int32
    tree_mask_indptr [B + 1]                            int32
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch


def words_per_row(num_draft: int) -> int:
    """The int32 words of one row of a tree of ``num_draft`` tokens (an int >= 0)."""
    if isinstance(num_draft, bool):
        raise ValueError(f"num_draft must be an int >= 0, got {num_draft!r}")
    try:
        t = operator.index(num_draft)
    except TypeError:
        raise ValueError(f"num_draft must be an int >= 0, got {num_draft!r}") from None
    if t < 0:
        raise ValueError(f"num_draft must be an int >= 0, got {t}")
    return (t + 31) // 32


# Rows of one tree packed at a time: bounds pack_visibility's int64 scratch to ~128 MB.
_PACK_SCRATCH_ELEMS = 1 << 24


def node_index(p: object, field: str, i: int) -> int:
    """``parents[i]`` as an int (numpy and 0-d torch integers too); raises naming the entry."""
    if isinstance(p, bool) or (isinstance(p, torch.Tensor) and p.dtype == torch.bool):
        raise ValueError(f"{field}[{i}] = {p!r}: a parent is a node index (an int), not a bool")
    try:
        return operator.index(p)
    except TypeError:
        raise ValueError(f"{field}[{i}] = {p!r}: a parent is a node index (an int)") from None


def visibility_from_parents(parents: Sequence[int], field: str = "parents") -> torch.Tensor:
    """[T, T] bool: row i sees i and its ancestors. ``parents[0] == -1``, ``parents[i] < i``.
    Errors name ``field`` and the entry."""
    t = len(parents)
    if t == 0:
        raise ValueError(f"{field} is empty; a draft tree has at least its root (node 0)")
    vis = torch.zeros(t, t, dtype=torch.bool)
    for i, entry in enumerate(parents):
        p = node_index(entry, field, i)
        if i == 0:
            if p != -1:
                raise ValueError(f"{field}[0] = {p}: the root (node 0) must have parent -1")
        elif not 0 <= p < i:
            raise ValueError(
                f"{field}[{i}] = {p}: a parent must be a node in [0, {i}) (it must precede its child)"
            )
        vis[i, i] = True
        if i > 0:
            vis[i] |= vis[p]
    return vis


def pack_visibility(visibility: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack per-request [T_b, T_b] bool matrices into (tree_mask, tree_mask_indptr), on the CPU.
    Integer matrices of 0s and 1s are taken as bool; any other value raises (it would spill into
    a neighbour's bit). An empty batch packs to ``(int32[0], int32[[0]])``."""
    if isinstance(visibility, torch.Tensor) or not isinstance(visibility, Sequence):
        raise ValueError(
            "visibility must be a sequence of [T, T] matrices, one per request, got "
            f"{type(visibility).__name__}: wrap one request's matrix as [matrix]"
        )
    blocks, indptr = [], [0]
    for b, vis in enumerate(visibility):
        if not isinstance(vis, torch.Tensor):
            try:
                vis = torch.as_tensor(vis)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ValueError(
                    f"visibility[{b}] must be a [T, T] bool matrix, got {vis!r:.60}: {e}"
                ) from None
        if vis.dim() != 2 or vis.shape[0] != vis.shape[1] or vis.shape[0] < 1:
            raise ValueError(
                f"visibility[{b}] must be a non-empty square [T, T] matrix, got {tuple(vis.shape)}"
            )
        if vis.dtype != torch.bool:
            if vis.is_floating_point() or vis.is_complex():
                raise ValueError(f"visibility[{b}] must be bool (or integers 0 and 1), got {vis.dtype}")
            if bool(((vis != 0) & (vis != 1)).any()):
                raise ValueError(
                    f"visibility[{b}] must be bool (or integers 0 and 1), got {vis.dtype} holding other values"
                )
            vis = vis != 0
        t = vis.shape[0]
        w = words_per_row(t)
        vis = vis.cpu()
        words = torch.empty(t, w, dtype=torch.int32)
        step = max(1, _PACK_SCRATCH_ELEMS // (w * 32))
        shifts = torch.arange(32, dtype=torch.int64)
        for r in range(0, t, step):
            rows = vis[r : r + step]
            padded = torch.zeros(rows.shape[0], w * 32, dtype=torch.int64)
            padded[:, :t] = rows
            sums = (padded.view(-1, w, 32) << shifts).sum(-1)  # < 2**32: fits int64
            words[r : r + step] = torch.where(sums >= 2**31, sums - 2**32, sums)  # bit 31 as the sign
        blocks.append(words.reshape(-1))
        indptr.append(indptr[-1] + t * w)
    tree_mask = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.int32)
    return tree_mask, torch.tensor(indptr, dtype=torch.int32)


def pack_parents(parents: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tree_mask, tree_mask_indptr) for a batch of trees given as parent arrays; errors name
    ``parents[b][i]``."""
    if isinstance(parents, (str, bytes, torch.Tensor)) or not isinstance(parents, Sequence):
        raise ValueError(
            f"parents must be a sequence of parent arrays, one per request, got {type(parents).__name__}"
        )
    for b, tree in enumerate(parents):
        if isinstance(tree, (str, bytes)) or not hasattr(tree, "__len__"):
            raise ValueError(
                f"parents[{b}] = {tree!r:.60} is not a parent array: parents holds one per request "
                "(wrap a single tree as [parents])"
            )
    return pack_visibility([visibility_from_parents(p, f"parents[{b}]") for b, p in enumerate(parents)])
