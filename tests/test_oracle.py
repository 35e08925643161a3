"""The float64 oracle against a brute-force definition, and its registry entry."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from harness import bundles, tree
from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.oracle import reference


def random_batch(prefix_lens: list[int], trees: list[tuple[int, ...]], heads: int, seed: int) -> VerifyBatch:
    g = torch.Generator().manual_seed(seed)
    kv_lens = [p + len(t) for p, t in zip(prefix_lens, trees, strict=True)]
    pool = sum(kv_lens) + 9
    kv_cache = torch.full((pool, QK_DIM), float("nan"), dtype=torch.bfloat16)
    slots = torch.randperm(pool, generator=g)[: sum(kv_lens)]
    kv_cache[slots] = torch.randn(len(slots), QK_DIM, generator=g).to(torch.bfloat16)
    n = sum(len(t) for t in trees)
    return VerifyBatch(
        q=(2 * torch.randn(n, heads, QK_DIM, generator=g)).to(torch.bfloat16),
        kv_cache=kv_cache,
        kv_indices=slots.to(torch.int32),
        qo_indptr=torch.tensor(
            [0, *torch.tensor([len(t) for t in trees]).cumsum(0).tolist()], dtype=torch.int32
        ),
        kv_indptr=torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32),
        prefix_lens=tuple(prefix_lens),
        parents=tuple(trees),
        sm_scale=1 / math.sqrt(192),
    )


def brute_force(batch: VerifyBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax over an explicit key list per (token, head) row: the definition, row by row."""
    q = batch.q.double()
    out = torch.empty(q.shape[0], q.shape[1], V_DIM, dtype=torch.float64)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float64)
    for b, (p, parents) in enumerate(zip(batch.prefix_lens, batch.parents, strict=True)):
        slots = batch.kv_indices[int(batch.kv_indptr[b]) : int(batch.kv_indptr[b + 1])].long()
        vis = tree.visibility(parents)
        for i in range(len(parents)):
            seen = list(range(p)) + [p + j for j in range(len(parents)) if vis[i, j]]
            keys = batch.kv_cache[slots[seen]].double()
            row = int(batch.qo_indptr[b]) + i
            for h in range(q.shape[1]):
                scores = keys @ q[row, h] * batch.sm_scale
                weights = torch.softmax(scores, dim=0)
                out[row, h] = weights @ keys[:, :V_DIM]
                lse[row, h] = torch.logsumexp(scores, dim=0)
    return out, lse


@pytest.mark.parametrize("chunk", [1, 7, 8192])
def test_oracle_matches_the_definition(chunk: int) -> None:
    batch = random_batch([0, 1, 5, 300], [(-1,), tree.chain(3), tree.random_tree(7, 1), (-1, 0, 0, 1)], 3, 0)
    out, lse = reference(batch, chunk=chunk)
    ref_out, ref_lse = brute_force(batch)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_single_key_gives_its_value_and_score() -> None:
    batch = random_batch([0], [(-1,)], 2, 3)
    out, lse = reference(batch)
    key = batch.kv_cache[batch.kv_indices[0].long()].double()
    torch.testing.assert_close(out[0], key[:V_DIM].expand(2, V_DIM), rtol=0, atol=1e-15)
    torch.testing.assert_close(lse[0], batch.q[0].double() @ key * batch.sm_scale, rtol=1e-15, atol=1e-13)


def test_oracle_reads_the_tree_from_parents() -> None:
    batch = random_batch([50], [(-1, 0, 0, 2)], 2, 4)
    other = replace(batch, parents=((-1, 0, 1, 2),))
    a, _ = reference(batch)
    b, _ = reference(other)
    # node 2 now also sees node 1, and so does node 3; nodes 0 and 1 are unchanged
    assert torch.equal(a[:2], b[:2])
    assert not torch.allclose(a[2:], b[2:])


def test_visibility_override_replaces_the_tree() -> None:
    batch = random_batch([10], [(-1, 0, 0)], 1, 5)
    causal = reference(batch, visibility=[tree.visibility(tree.chain(3))])
    assert torch.equal(causal[0], reference(replace(batch, parents=(tree.chain(3),)))[0])


def test_visibility_override_of_the_wrong_shape_is_rejected() -> None:
    batch = random_batch([10], [(-1, 0, 0)], 1, 5)
    with pytest.raises(
        ValueError, match=r"visibility\[0\] must be a bool tensor of shape \(3, 3\), got torch.bool \(2, 2\)"
    ):
        reference(batch, visibility=[torch.ones(2, 2, dtype=torch.bool)])


def _slots(batch: VerifyBatch, **at: int) -> VerifyBatch:
    kv_indices = batch.kv_indices.clone()
    for i, slot in at.items():
        kv_indices[int(i[1:])] = slot
    return replace(batch, kv_indices=kv_indices)


BAD_BATCHES: dict[str, tuple[Callable[[VerifyBatch], VerifyBatch], str]] = {
    # a slot of -1 would read the pool's last row through Python's negative indexing
    "negative slot": (
        lambda b: _slots(b, i3=-1),
        r"kv_indices\[3\] = -1 is outside the pool: expected a slot in \[0, 22\)",
    ),
    "slot past the pool": (lambda b: _slots(b, i0=22), r"kv_indices\[0\] = 22 is outside the pool"),
    "float slots": (
        lambda b: replace(b, kv_indices=b.kv_indices.float()),
        "kv_indices must be a 1-D integer tensor",
    ),
    # a negative start would wrap through slicing and read other requests' slots
    "shifted kv_indptr": (
        lambda b: replace(b, kv_indptr=b.kv_indptr - 7),
        r"qo_indptr\[0\] = 0 and kv_indptr\[0\] = -7; both must be 0",
    ),
    "kv_indptr past kv_indices": (
        lambda b: replace(b, kv_indices=b.kv_indices[:-1]),
        r"kv_indptr\[-1\] = 13 is past the end of kv_indices \(12 slots\)",
    ),
    "2-D qo_indptr": (
        lambda b: replace(b, qo_indptr=b.qo_indptr[None]),
        "qo_indptr must be a 1-D integer tensor",
    ),
    "no heads": (lambda b: replace(b, q=b.q[:, :0]), r"q has shape \(3, 0, 576\), expected .*H >= 1"),
    "negative prefix": (
        lambda b: replace(b, prefix_lens=(-1,)),
        r"prefix_lens\[0\] = -1; expected an int >= 0",
    ),
    "pool of the wrong width": (
        lambda b: replace(b, kv_cache=b.kv_cache[:, :512]),
        r"kv_cache has shape \(22, 512\)",
    ),
    "NaN sm_scale": (
        lambda b: replace(b, sm_scale=float("nan")),
        "sm_scale = nan; expected a finite positive number",
    ),
    "zero sm_scale": (
        lambda b: replace(b, sm_scale=0.0),
        "sm_scale = 0.0; expected a finite positive number",
    ),
    "string sm_scale": (
        lambda b: replace(b, sm_scale="0.1"),
        "sm_scale = '0.1'; expected a finite positive number",
    ),
}


@pytest.mark.parametrize("name", BAD_BATCHES)
def test_a_bad_batch_is_refused_naming_the_field(name: str) -> None:
    batch = random_batch([10], [(-1, 0, 0)], 1, 5)
    edit, message = BAD_BATCHES[name]
    with pytest.raises(ValueError, match=message):
        reference(edit(batch))


def test_a_pool_with_a_unit_middle_dim_is_read_as_the_flat_pool() -> None:
    batch = random_batch([10], [(-1, 0, 0)], 2, 5)
    flat = reference(batch)
    viewed = reference(replace(batch, kv_cache=batch.kv_cache.view(-1, 1, QK_DIM)))
    assert all(torch.equal(a, b) for a, b in zip(flat, viewed, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk": 2.5}, r"chunk = 2.5; expected an int >= 1"),
        ({"chunk": True}, r"chunk = True; expected an int >= 1"),
        ({"visibility": []}, r"visibility has 0 matrices, expected one per request \(1\)"),
        ({"visibility": [[[True]]]}, r"visibility\[0\] must be a bool tensor of shape \(3, 3\), got list"),
        ({"visibility": [torch.ones(3, 3)]}, r"visibility\[0\] must be a bool tensor .* got torch.float32"),
    ],
)
def test_bad_oracle_arguments_are_named(kwargs: dict, message: str) -> None:
    batch = random_batch([10], [(-1, 0, 0)], 1, 5)
    with pytest.raises(ValueError, match=message):
        reference(batch, **kwargs)


def test_a_draft_row_that_sees_no_key_is_refused() -> None:
    # Without a prefix a row hidden from every draft token (itself too) has an empty softmax: NaN.
    batch = random_batch([0], [(-1, 0)], 1, 5)
    vis = tree.visibility((-1, 0)).clone()
    vis[1] = False
    with pytest.raises(ValueError, match=r"visibility\[0\] row 1 sees no key \(request 0 has no prefix\)"):
        reference(batch, visibility=[vis])


def test_query_count_must_match_the_tree() -> None:
    batch = random_batch([10], [(-1, 0, 0)], 1, 5)
    bad = replace(batch, parents=((-1, 0),))
    with pytest.raises(ValueError, match="request 0: qo_indptr gives 3 queries, its tree has 2 nodes"):
        reference(bad)


def test_chunk_size_does_not_change_a_bundle_result(batch: Callable[[str], VerifyBatch]) -> None:
    b = batch("smoke")
    out_a, lse_a = reference(b, chunk=8192)
    out_b, lse_b = reference(b, chunk=100)
    torch.testing.assert_close(out_a, out_b, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(lse_a, lse_b, rtol=1e-13, atol=1e-13)


def test_oracle_is_registered_as_the_reference() -> None:
    from harness.registry import get

    impl = get("oracle")
    assert impl.is_reference and impl.device_kind == "any"
    assert impl.availability(torch.device("cpu")) == (True, "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given on a machine without CUDA")
def test_oracle_on_cuda_is_unavailable_without_a_gpu() -> None:
    from harness.registry import get

    ok, reason = get("oracle").availability(torch.device("cuda"))
    assert not ok and "no CUDA device" in reason


@pytest.mark.gpu
def test_oracle_on_cuda_matches_cpu(bundle: Callable[[str], bundles.Bundle]) -> None:
    b = bundle("ragged")
    cpu = bundles.to_batch(b, "cpu")
    out_cpu, lse_cpu = reference(cpu)
    out_gpu, lse_gpu = reference(cpu.to("cuda"))
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse_gpu.cpu(), lse_cpu, rtol=1e-12, atol=1e-12)
