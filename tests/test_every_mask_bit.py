"""Draft keys that decide their rows: a single wrong bit of the tree mask cannot pass, wherever the
draft tokens sit in a KV tile and however long the prefix before them.

With random data (the fuzz, ``test_draft_tiles_at_every_offset_and_mask_word``) a draft key weighs
about as much as one prefix key, so behind a long prefix a draft token that sees one key too many or
too few reads the same within parity's tolerance. Here every request's queries share a direction
``u`` in the RoPE dims, and each draft key has a component along ``u`` that scores it ``BOOST`` above
the log of the whole prefix's mass for every query of its request: a row is mostly the draft keys it
sees (its ancestors and itself, at most ~15 in these random trees), and their values are random.

- ``test_every_single_bit_flip_fails_parity`` (CPU, in CI): against the float64 oracle, flipping
  any one bit of any request's visibility (hiding an ancestor or the token itself, or showing any
  other token, earlier or later) moves one of that token's rows by at least ``MIN_MOVE_REL`` and
  its lse by at least ``MIN_MOVE_LSE``; a closed form gives the move of every bit, checked
  against the oracle run with flipped bits.
- ``test_kernel_sees_exactly_each_tree`` (GPU): the kernel, every config the GPU runs, passes
  parity's tolerances on these batches.

Prefixes put the first draft key at 0, 1, 16, 31, 47 and 48 keys into a KV tile (32, 48 or 64 keys
in the configs) and behind a split request's 4k and 32k keys; draft counts of 31 and 33 sit on
either side of one 32-bit mask word, 64 and 65 fill two words and start a third, 97 starts a
fourth, and 256 fills eight.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from harness import tree
from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.oracle import reference
from harness.parity import COS_TOL, LSE_TOL, REL_TOL

SM_SCALE = 1 / math.sqrt(192)
PREFIXES = (0, 1, 16, 31, 47, 48, 95, 4096 + 17, 32768 + 13)
DRAFTS = (31, 33, 64, 65, 97, 256)
HEADS = 2
# Queries: eps * z + C_U * u, z random and orthogonal to u; so prefix scores stay small (standard
# deviation ~0.2) and a draft key's score is set by its component along u.
EPS, C_U = 0.1, 8.0
BOOST = 3.0
MIN_MOVE_REL = 10 * REL_TOL
MIN_MOVE_LSE = 20 * LSE_TOL


@dataclass(frozen=True)
class Shape:
    num_draft: int
    seed: int


SHAPES = tuple(Shape(t, 300 + t) for t in DRAFTS)


def _orthogonal(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return x - (x @ u)[..., None] * u


def build(shape: Shape) -> VerifyBatch:
    """One request per prefix length, each with ``shape.num_draft`` draft tokens: every other one
    a chain where that leaves rows of at most 33 draft keys (a deeper row weighs each key less),
    random trees otherwise."""
    g = torch.Generator().manual_seed(shape.seed)
    t = shape.num_draft
    kv_lens = [p + t for p in PREFIXES]
    total = sum(kv_lens)
    pool = total + total // 8 + 5
    slots = torch.randperm(pool, generator=g)[:total]
    keys = torch.randn(total, QK_DIM, generator=g, dtype=torch.float64)
    qs, parents = [], []
    kv_start = [0, *itertools.accumulate(kv_lens)]
    for b, p in enumerate(PREFIXES):
        parents.append(tree.chain(t) if t <= 33 and b % 2 == 0 else tree.random_tree(t, shape.seed * 10 + b))
        u = torch.zeros(QK_DIM, dtype=torch.float64)
        u[V_DIM:] = torch.randn(QK_DIM - V_DIM, generator=g, dtype=torch.float64)
        u /= u.norm()
        z = _orthogonal(torch.randn(t, HEADS, QK_DIM, generator=g, dtype=torch.float64), u)
        qs.append(EPS * z + C_U * u)
        # Every draft key scores ln(P + 1) + BOOST against every query of its request (up to the
        # small eps * z . r term): e^BOOST times the prefix's whole mass (p keys of score ~0).
        a = (math.log(p + 1) + BOOST) / (SM_SCALE * C_U)
        draft = slice(kv_start[b] + p, kv_start[b + 1])
        keys[draft] = _orthogonal(keys[draft], u) + a * u
    kv_cache = torch.full((pool, QK_DIM), float("nan"), dtype=torch.float64)
    kv_cache[slots] = keys
    return VerifyBatch(
        q=torch.cat(qs).to(torch.bfloat16),
        kv_cache=kv_cache.to(torch.bfloat16),
        kv_indices=slots.to(torch.int32),
        qo_indptr=torch.tensor([t * b for b in range(len(PREFIXES) + 1)], dtype=torch.int32),
        kv_indptr=torch.tensor(kv_start, dtype=torch.int32),
        prefix_lens=PREFIXES,
        parents=tuple(parents),
        sm_scale=SM_SCALE,
    )


def bit_moves(
    batch: VerifyBatch, out: torch.Tensor, lse: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per request, ([T, T] relative move, [T, T] lse move) of token i's rows (the larger of its
    heads) when bit (i, j) of the visibility is flipped, from the batch's float64 oracle ``out``,
    ``lse``.

    With w the weight key j would have in row (i, h) and v its value, the row's output o becomes
    (o - w v) / (1 - w) when a visible key is hidden and (o + w v) / (1 + w) when a hidden one is
    shown; lse moves by log(1 -+ w)."""
    qo, kv = batch.host_indptrs()
    moves = []
    for b, (p, parents) in enumerate(zip(batch.prefix_lens, batch.parents, strict=True)):
        vis = tree.visibility(parents).to(torch.float64)  # [T, T]
        q = batch.q[qo[b] : qo[b + 1]].to(torch.float64)  # [T, H, 576]
        slots = batch.kv_indices[kv[b] + p : kv[b + 1]].long()
        k = batch.kv_cache[slots].to(torch.float64)  # [T, 576] draft keys
        o, l_ = out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]]  # [T, H, 512], [T, H]
        w = torch.exp(batch.sm_scale * torch.einsum("ihd,jd->ihj", q, k) - l_[..., None])  # [T, H, T]
        sign = 1 - 2 * vis[:, None, :]  # -1 where visible (hidden by the flip), +1 where shown
        v = k[:, :V_DIM]
        # |v_j - o_ih| from |v|^2 - 2 v.o + |o|^2
        dist = (
            (v * v).sum(-1)[None, None, :]
            - 2 * torch.einsum("ihd,jd->ihj", o, v)
            + (o * o).sum(-1)[..., None]
        )
        left = 1 + sign * w  # 0 where the flip hides a row's only key (P = 0, the root): no output
        rel = w * dist.clamp_min(0).sqrt() / (left * o.norm(dim=-1)[..., None])
        dl = torch.log(left).abs()
        rel[left < 1e-9], dl[left < 1e-9] = math.inf, math.inf
        moves.append((rel.max(dim=1).values, dl.max(dim=1).values))
    return moves


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s.num_draft}")
def test_every_single_bit_flip_fails_parity(shape: Shape) -> None:
    batch = build(shape)
    for b, (rel, dl) in enumerate(bit_moves(batch, *reference(batch))):
        i, j = divmod(int(rel.argmin()), rel.shape[1])
        assert float(rel.min()) >= MIN_MOVE_REL, (
            f"request {b}: bit ({i}, {j}) moves its row by {float(rel.min()):.3g}"
        )
        assert float(dl.min()) >= MIN_MOVE_LSE, (
            f"request {b}: a bit moves its lse by only {float(dl.min()):.3g}"
        )
    assert (REL_TOL, COS_TOL, LSE_TOL) == (1e-2, 0.9999, 1e-3)  # the GPU test checks these


def test_the_moves_are_what_the_oracle_gives_for_flipped_bits() -> None:
    """bit_moves' closed form against the oracle run with the visibility flipped: in the 32k-prefix
    request, token 5 shown token 9 (a later one) and token 9 its parent hidden."""
    batch = build(SHAPES[1])
    b = PREFIXES.index(32768 + 13)
    out, lse = reference(batch)
    rel, dl = bit_moves(batch, out, lse)[b]
    parent = batch.parents[b][9]
    for i, j in ((5, 9), (9, parent)):
        vis = [tree.visibility(p) for p in batch.parents]
        vis[b][i, j] = not bool(vis[b][i, j])
        m_out, m_lse = reference(batch, visibility=vis)
        row = slice(int(batch.qo_indptr[b]) + i, int(batch.qo_indptr[b]) + i + 1)
        moved = ((m_out[row] - out[row]).norm(dim=-1) / out[row].norm(dim=-1)).max()
        assert float(moved) == pytest.approx(float(rel[i, j]), rel=1e-6)
        assert float((m_lse[row] - lse[row]).abs().max()) == pytest.approx(float(dl[i, j]), rel=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s.num_draft}")
def test_kernel_sees_exactly_each_tree(shape: Shape) -> None:
    """Every config passes; and, as the control on the GPU, the kernel given a mask one bit off in
    the 32k-prefix request (its last token's parent hidden, or its root shown token 1) fails."""
    from test_kernel_gpu import assert_close, describe, gpu_configs, run_kernel

    import kernel

    batch = build(shape).to(torch.device("cuda"))
    b = PREFIXES.index(32768 + 13)
    last = shape.num_draft - 1
    flips = ((last, batch.parents[b][last]), (0, 1))
    for config in ("auto", *gpu_configs()):
        out, lse = run_kernel(batch, config=config)
        assert_close(out, lse, batch, f"{describe(batch)} config={config}")
        for bit in flips:
            vis = [tree.visibility(p) for p in batch.parents]
            vis[b][bit] = not bool(vis[b][bit])
            mask, mask_indptr = (x.cuda() for x in kernel.pack_visibility(vis))
            args = (batch.q, batch.kv_cache, batch.kv_indices, batch.qo_indptr, batch.kv_indptr)
            wrong = kernel.verify_attention(*args, mask, mask_indptr, SM_SCALE, validate=False, config=config)
            with pytest.raises(AssertionError):
                assert_close(*wrong, batch, f"bit {bit} flipped, config={config}")
