"""Token-exact parity: a seeded readout turns each draft position's output into a target token.

Per draft position the output, flattened over heads, is ``f [H * 512]``; its logits over a
vocabulary of ``VOCAB`` tokens are ``W f``. ``W [VOCAB, H * 512]`` repeats one code per token over
the heads, ``W[v, h * 512 + d] = code[v, d]``, and the codes are generated integer-exactly from
the readout seed with the pool's hash (``harness.materialise.filler_values``), so nothing is stored.

Certification: the golden token ``g`` of a position is safe against every implementation whose
per-row relative error is at most ``TOL`` (then ``||f_impl - f_ref|| <= TOL * ||f_ref||``) when,
for every other token j,

    (l_g - l_j) > KAPPA * TOL * ||f|| * ||w_g - w_j||

since the error moves ``l_g - l_j`` by at most ``TOL * ||f|| * ||w_g - w_j||``. The ratio of the two
sides, minimised over j and positions, is the bundle's certified margin (must exceed ``KAPPA``).
It is computed with correctly rounded sums (``math.fsum``; the products of fp32 features and
codes are exact in float64), not a BLAS product, so that it is the same float on every CPU: a
BLAS's kernel, chosen per CPU, sums in its own order, and the stored margin then differed in its
last bit between machines, which broke the bundles' byte-identical regeneration.

Tree walk (the accepted path): from the root, move to the first child (index order) whose draft
token equals the current node's target token; stop when none does. The path lists node indices,
root first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from harness.batch import V_DIM
from harness.materialise import filler_values
from harness.tree import children

VOCAB = 64
TOL = 1e-2  # the per-row relative tolerance of DESIGN.md section 4
KAPPA = 1.5


def codes(seed: int) -> np.ndarray:
    """[VOCAB, 512] float64 token codes of a readout seed (exact values k / 256)."""
    index = np.arange(VOCAB * V_DIM, dtype=np.uint32)
    return filler_values(seed, index).astype(np.float64).reshape(VOCAB, V_DIM)


def readout_matrix(seed: int, num_heads: int) -> np.ndarray:
    """W [VOCAB, num_heads * 512] float64: each token's code repeated over the heads."""
    return np.tile(codes(seed), (1, num_heads))


def _features(out: torch.Tensor) -> np.ndarray:
    if out.dim() != 3 or out.shape[2] != V_DIM:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected [N, H, {V_DIM}]")
    return out.detach().to(device="cpu", dtype=torch.float64).reshape(out.shape[0], -1).numpy()


def logits(out: torch.Tensor, seed: int) -> np.ndarray:
    """[N, VOCAB] float64 logits of every draft position of ``out [N, H, 512]``."""
    f = _features(out)
    return f @ readout_matrix(seed, out.shape[1]).T


def target_tokens(out: torch.Tensor, seed: int) -> np.ndarray:
    """[N] int64 argmax token per draft position (the lowest index on an exact tie)."""
    return np.argmax(logits(out, seed), axis=1).astype(np.int64)


def certified_ratios(out: torch.Tensor, seed: int, tol: float = TOL) -> np.ndarray:
    """[N] per position: min over j != g of (l_g - l_j) / (tol * ||f|| * ||w_g - w_j||).

    A position is certified when its ratio exceeds ``KAPPA``; zero or negative means a tie or
    worse (cannot happen for the argmax unless tied).
    """
    f = _features(out)
    w = readout_matrix(seed, out.shape[1])
    ratios = np.empty(f.shape[0])
    for i in range(f.shape[0]):
        # Every sum correctly rounded (module docstring): the logits, ||f||^2, and ||w_g - w_j||^2,
        # whose terms are multiples of 2^-16 that float64 sums exactly in any order.
        lg = np.array([math.fsum(row) for row in (w * f[i]).tolist()])
        g = int(np.argmax(lg))
        f_norm = math.sqrt(math.fsum((f[i] * f[i]).tolist()))
        others = np.arange(VOCAB) != g
        gap = lg[g] - lg[others]
        d = w[g] - w[others]
        w_dist = np.sqrt((d * d).sum(axis=1))
        ratios[i] = np.min(gap / (tol * f_norm * w_dist))
    return ratios


def accepted_path(parents: Sequence[int], draft_tokens: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The accepted path of one request's tree walk (node indices, root first)."""
    if not len(parents) == len(draft_tokens) == len(targets):
        raise ValueError(
            f"parents ({len(parents)}), draft_tokens ({len(draft_tokens)}) and targets ({len(targets)}) "
            "must have one entry per draft node"
        )
    kids = children(parents)
    path = [0]
    while True:
        node = path[-1]
        nxt = next((c for c in kids[node] if int(draft_tokens[c]) == int(targets[node])), None)
        if nxt is None:
            return path
        path.append(nxt)


def accepted_paths(
    parents: Sequence[Sequence[int]], qo_indptr: Sequence[int], draft_tokens: np.ndarray, targets: np.ndarray
) -> list[list[int]]:
    """Per request the accepted path, given batch-wide ``draft_tokens`` and ``targets`` [N]."""
    paths = []
    for b, tree in enumerate(parents):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        paths.append(accepted_path(tree, draft_tokens[lo:hi], targets[lo:hi]))
    return paths


def draft_tokens_for(
    parents: Sequence[int], targets: Sequence[int], rng: np.random.Generator, p_match: float = 0.7
) -> np.ndarray:
    """[T] int64 draft tokens of one tree: node j's token is its parent's target with probability
    ``p_match``, else a different token; the root's (already verified) token is drawn at random.
    Node 1 (the root's first child) always matches, so every walk accepts at least one draft token
    and the walk itself is exercised."""
    tokens = np.empty(len(parents), dtype=np.int64)
    tokens[0] = rng.integers(0, VOCAB)
    for j in range(1, len(parents)):
        want = int(targets[parents[j]])
        if rng.random() < p_match or j == 1:
            tokens[j] = want
        else:
            tokens[j] = (want + 1 + rng.integers(0, VOCAB - 1)) % VOCAB  # any token but ``want``
    return tokens
