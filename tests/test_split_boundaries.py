"""Needles on both sides of every 16-key boundary: a key lost or read twice where the kernel
splits a request or starts a KV tile cannot pass.

Where the kernel cuts a request (its splits, of L KV tiles each, and the tiles inside them) depends
on the call: the plan picks L from the batch and the SM count, and each config has its own tile (32,
48 or 64 keys). All of them start at multiples of 16 keys from the request's first key (the
launcher asserts ``kBlockN % 16 == 0`` for every config, kernel/csrc/verify_attention.cu). So the
batches here plant a needle, a prefix key that dominates one (token, head) row, at positions
16k - 1 and 16k of every prefix, at 0 and at P - 1: whatever split length and tile the kernel runs,
each of its boundaries has a needle on either side.

- ``test_every_boundary_key_decides_its_row`` (CPU, in CI): against the float64 oracle, dropping or
  doubling any one of those keys moves its row by at least ``MIN_MOVE_REL`` (ten times parity's
  1e-2) and its lse by at least ``MIN_MOVE_LSE``: the check below can fail for each boundary of
  every plan, which is the mutation control of this test.
- ``test_kernel_at_every_split_boundary`` (GPU): the kernel, every config the GPU runs, passes the
  parity tolerances on these batches, laid out for this GPU's SM count and for sm_120 parts'
  (``num_sms``: 188 and 170), whose splits fall elsewhere.

The bundles do not carry these needles: one at every 16 keys would make them decide most rows, and
the bundles measure the output where no single key does (bundles/README.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from harness import tree
from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.mutations import _with_prefixes
from harness.oracle import reference
from harness.parity import COS_TOL, LSE_TOL, REL_TOL

# Every split and tile of every config starts at a multiple of this many keys from its request's
# first key (kernel/csrc: kBlockN is 32, 48 or 64, and a split is a whole number of tiles).
BOUNDARY = 16
SM_SCALE = 1 / math.sqrt(192)
# A needle's score is this far above the log of its row's expected background mass, so that
# the row is mostly its needles (each ~e^3 times the whole rest of the prefix).
NEEDLE_BOOST = 3.0
# What dropping or doubling one needle must do to its row at least: parity fails a row whose
# relative error exceeds REL_TOL or whose lse is off by more than LSE_TOL; these leave room for the
# kernel's own rounding on top of the mutant's error.
MIN_MOVE_REL = 10 * REL_TOL
MIN_MOVE_LSE = 20 * LSE_TOL


@dataclass(frozen=True)
class Shape:
    prefix: tuple[int, ...]
    draft: tuple[int, ...]
    heads: int
    seed: int


# Two batches: 128-, 40- and 512-row requests at 8 heads (`auto` runs wgmma-ws on an H200), and
# 256- and 512-row requests at 32 heads (wgmma-ws-pipe). Long prefixes split across the SMs, short
# ones into a few splits or none; none of the lengths is a multiple of 16.
SHAPES = (
    Shape(prefix=(33007, 9005, 2001), draft=(16, 5, 64), heads=8, seed=101),
    Shape(prefix=(20011, 4099), draft=(8, 16), heads=32, seed=202),
)


def needle_positions(prefix_len: int) -> list[int]:
    """0, P - 1, and 16k - 1 and 16k for every multiple of 16 inside the prefix."""
    marks = {0, prefix_len - 1}
    for edge in range(BOUNDARY, prefix_len, BOUNDARY):
        marks |= {edge - 1, edge}
    return sorted(m for m in marks if 0 <= m < prefix_len)


@dataclass(frozen=True)
class NeedleBatch:
    batch: VerifyBatch
    # (request, prefix position, token within the request, head) of every needle
    needles: tuple[tuple[int, int, int, int], ...]


def build(shape: Shape) -> NeedleBatch:
    """The batch on the CPU: random bf16 queries and keys, shuffled slots in a pool whose other
    rows hold NaN, random trees; then each needle's key replaced by one whose value part is random
    and whose RoPE part sets its score against its own row to the needle score."""
    g = torch.Generator().manual_seed(shape.seed)
    h = shape.heads
    kv_lens = [p + t for p, t in zip(shape.prefix, shape.draft, strict=True)]
    total = sum(kv_lens)
    pool = total + total // 8 + 5
    kv_cache = torch.full((pool, QK_DIM), float("nan"), dtype=torch.float64)
    slots = torch.randperm(pool, generator=g)[:total]
    keys = torch.randn(total, QK_DIM, generator=g, dtype=torch.float64)
    q = torch.randn(sum(shape.draft), h, QK_DIM, generator=g, dtype=torch.float64)
    q = q.to(torch.bfloat16).to(torch.float64)
    parents = tuple(tree.random_tree(t, shape.seed * 100 + b) for b, t in enumerate(shape.draft))
    needles = []
    kv_start = [0, *itertools.accumulate(kv_lens)]
    q_start = [0, *itertools.accumulate(shape.draft)]
    for b, (p, t) in enumerate(zip(shape.prefix, shape.draft, strict=True)):
        positions = needle_positions(p)
        # At least two needles a row: a row that is one needle reads almost the same with it
        # counted twice (the lse alone would show it).
        rows = torch.randperm(t * h, generator=g)[: max(1, min(t * h, len(positions) // 2))]
        for k, pos in enumerate(positions):
            ti, hi = divmod(int(rows[k % len(rows)]), h)
            query = q[q_start[b] + ti, hi]
            # The row's background: p keys of N(0, 1) entries, scores N(0, sigma^2) with
            # sigma = SM_SCALE * |q|, so an expected mass of p * exp(sigma^2 / 2).
            sigma = SM_SCALE * float(query.norm())
            score = math.log(p) + sigma**2 / 2 + NEEDLE_BOOST
            key = keys[kv_start[b] + pos]
            q_lat, q_rope = query[:V_DIM], query[V_DIM:]
            coef = (score / SM_SCALE - float(q_lat @ key[:V_DIM])) / float(q_rope @ q_rope)
            key[V_DIM:] = coef * q_rope
            needles.append((b, pos, ti, hi))
    kv_cache[slots] = keys
    return NeedleBatch(
        batch=VerifyBatch(
            q=q.to(torch.bfloat16),
            kv_cache=kv_cache.to(torch.bfloat16),
            kv_indices=slots.to(torch.int32),
            qo_indptr=torch.tensor(q_start, dtype=torch.int32),
            kv_indptr=torch.tensor(kv_start, dtype=torch.int32),
            prefix_lens=shape.prefix,
            parents=parents,
            sm_scale=SM_SCALE,
        ),
        needles=tuple(needles),
    )


def needle_moves(nb: NeedleBatch, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every needle, (relative move of its row's output, absolute move of its lse) when that
    one key is dropped, and when it is counted twice: [needles, 2] each, from the batch's float64
    oracle ``out``, ``lse``.

    With w the key's softmax weight in its row and v its value, the row's output o becomes
    (o - w v) / (1 - w) without it and (o + w v) / (1 + w) with it twice; lse moves by log(1 -+ w)."""
    batch = nb.batch
    qo, kv = batch.host_indptrs()
    rel = torch.empty(len(nb.needles), 2, dtype=torch.float64)
    dlse = torch.empty_like(rel)
    for i, (b, pos, ti, hi) in enumerate(nb.needles):
        row = qo[b] + ti
        key = batch.kv_cache[int(batch.kv_indices[kv[b] + pos])].to(torch.float64)
        query = batch.q[row, hi].to(torch.float64)
        w = math.exp(batch.sm_scale * float(query @ key) - float(lse[row, hi]))
        o, v = out[row, hi], key[:V_DIM]
        for j, sign in enumerate((-1.0, 1.0)):
            moved = (o + sign * w * v) / (1 + sign * w)
            rel[i, j] = (moved - o).norm() / o.norm()
            dlse[i, j] = abs(math.log1p(sign * w))
    return rel, dlse


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"P{list(s.prefix)}-H{s.heads}")
def test_every_boundary_key_decides_its_row(shape: Shape) -> None:
    nb = build(shape)
    # Every boundary of every request has its needles (and only prefix keys are needles).
    for b, p in enumerate(shape.prefix):
        planted = {pos for r, pos, _, _ in nb.needles if r == b}
        assert planted == set(needle_positions(p))
        assert {0, p - 1} <= planted
        assert all({e - 1, e} <= planted for e in range(BOUNDARY, p, BOUNDARY))
    rel, dlse = needle_moves(nb, *reference(nb.batch))
    worst = int(rel.min(dim=1).values.argmin())
    assert float(rel.min()) >= MIN_MOVE_REL, (
        f"needle {nb.needles[worst]} moves its row by only {float(rel[worst].min()):.3g}"
    )
    assert float(dlse.min()) >= MIN_MOVE_LSE, f"a needle moves its lse by only {float(dlse.min()):.3g}"
    # The checks used on the GPU are parity's, whose tolerances these margins are measured against.
    assert (REL_TOL, COS_TOL, LSE_TOL) == (1e-2, 0.9999, 1e-3)


def test_the_moves_are_what_the_oracle_gives_for_a_mutated_batch() -> None:
    """needle_moves' closed form against the oracle run on a batch that really drops one boundary
    key and reads another twice (split-skip and split-overlap at one boundary each)."""
    nb = build(SHAPES[1])
    out, lse = reference(nb.batch)
    rel, dlse = needle_moves(nb, out, lse)
    p = nb.batch.prefix_lens[0]
    # Request 0 without its key 16 * 40 and with key 16 * 90 - 1 twice; the others as they were.
    dropped, doubled = BOUNDARY * 40, BOUNDARY * 90 - 1

    def pick(prefix_len: int) -> list[int]:
        if prefix_len != p:
            return list(range(prefix_len))
        kept = [i for i in range(prefix_len) if i != dropped]
        return sorted(kept + [doubled])

    mutated = _with_prefixes(nb.batch, pick)
    m_out, m_lse = reference(mutated)
    found = {n[:2]: (k, n[2:]) for k, n in enumerate(nb.needles)}
    # Different rows, so each row moves by its own needle only (the other key is background there).
    assert found[(0, dropped)][1] != found[(0, doubled)][1]
    for pos, j in ((dropped, 0), (doubled, 1)):
        i, (ti, hi) = found[(0, pos)]
        o, mo = out[ti, hi], m_out[ti, hi]
        assert float((mo - o).norm() / o.norm()) == pytest.approx(float(rel[i, j]), rel=1e-3)
        assert abs(float(m_lse[ti, hi] - lse[ti, hi])) == pytest.approx(float(dlse[i, j]), rel=1e-3)


# The SM counts the GPU test lays the calls out for: this GPU's own, and sm_120's RTX PRO 6000
# (188, the target box) and RTX 5090 (170), whose splits fall elsewhere (`num_sms`).
PLAN_SMS = (None, 188, 170)


@pytest.mark.gpu
@pytest.mark.parametrize("num_sms", PLAN_SMS, ids=lambda n: f"sms-{n or 'own'}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"P{list(s.prefix)}-H{s.heads}")
def test_kernel_at_every_split_boundary(shape: Shape, num_sms: int | None) -> None:
    """Every config passes; and, as the control on the GPU, the kernel given kv_indices that read
    key 16 * 40 - 1 in place of key 16 * 40 of the first request (one boundary key lost, its
    neighbour read twice) fails."""
    from test_kernel_gpu import assert_close, describe, gpu_configs, run_kernel

    batch = build(shape).batch.to(torch.device("cuda"))
    shifted = batch.kv_indices.clone()
    shifted[BOUNDARY * 40] = shifted[BOUNDARY * 40 - 1]
    for config in ("auto", *gpu_configs()):
        label = f"{describe(batch)} config={config} num_sms={num_sms}"
        out, lse = run_kernel(batch, config=config, num_sms=num_sms)
        assert_close(out, lse, batch, label)
        wrong = run_kernel(batch, config=config, validate=False, kv_indices=shifted, num_sms=num_sms)
        with pytest.raises(AssertionError):
            assert_close(*wrong, batch, f"key {BOUNDARY * 40} read as its neighbour, {label}")
