"""The deterministic KV pool: integer hash, bf16 rounding, NaN fill, planted rows, sha256."""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

from harness import bundles
from harness.materialise import (
    BF16_NAN_BITS,
    PoolMismatchError,
    bf16_bits,
    filler_bits,
    filler_values,
    hash32,
    lowbias32,
    materialise,
    pool_bits,
    pool_sha256,
)

MASK = 0xFFFFFFFF


def py_lowbias32(x: int) -> int:
    """The mixer with Python integers and explicit masking: an independent implementation."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK
    x ^= x >> 16
    return x


def py_hash32(seed: int, index: int) -> int:
    k1, k2 = py_lowbias32(seed), py_lowbias32(seed ^ 0x9E3779B9)
    return py_lowbias32((py_lowbias32(index ^ k1) + k2) & MASK)


def py_filler(seed: int, index: int) -> float:
    x = py_hash32(seed, index)
    return (sum((x >> s) & 0xFF for s in (0, 8, 16, 24)) - 510) / 256


def test_lowbias32_wraps_like_32_bit_integers() -> None:
    xs = [0, 1, 2, 0x7FFFFFFF, 0x80000000, MASK, 123456789, 0xDEADBEEF]
    got = lowbias32(np.array(xs, dtype=np.uint32))
    assert got.tolist() == [py_lowbias32(x) for x in xs]


def test_hash32_matches_an_independent_implementation() -> None:
    index = np.random.default_rng(0).integers(0, 2**32, size=2000, dtype=np.uint64).astype(np.uint32)
    for seed in (0, 1, 2**32 - 1):
        assert hash32(seed, index).tolist() == [py_hash32(seed, int(i)) for i in index]


def test_hash32_rejects_a_seed_outside_32_bits() -> None:
    with pytest.raises(ValueError, match=r"seed = 4294967296; expected 0 <= seed < 2\*\*32"):
        hash32(2**32, np.zeros(1, dtype=np.uint32))


def test_filler_values_are_irwin_hall_of_the_hash_bytes() -> None:
    index = np.arange(0, 5000, 7, dtype=np.uint32)
    assert filler_values(42, index).tolist() == [py_filler(42, int(i)) for i in index]


def test_filler_is_zero_mean_with_std_0_577() -> None:
    values = filler_values(9, np.arange(2**20, dtype=np.uint32)).astype(np.float64)
    assert abs(values.mean()) < 3 * 0.577 / 2**10
    assert abs(values.std() - np.sqrt(4 * (256**2 - 1) / 12) / 256) < 0.002


def bf16_via_torch(values: np.ndarray) -> list[int]:
    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).tolist()


def test_bf16_bits_of_float32_round_to_nearest_even() -> None:
    one = 0x3F800000
    ties = [one | 0x8000, one | 0x18000, one | 0x7FFF, one | 0x8001]  # tie to even down, tie up, below, above
    values = np.array(ties, dtype=np.uint32).view(np.float32)
    assert bf16_bits(values).tolist() == [0x3F80, 0x3F82, 0x3F80, 0x3F81]
    rand = np.random.default_rng(1).standard_normal(100_000).astype(np.float32) * 10
    assert bf16_bits(rand).tolist() == bf16_via_torch(rand)


def test_bf16_bits_of_float64_round_once() -> None:
    # Just above the halfway point between 1 and the next bf16: rounding through float32 first
    # would drop the 2**-40 and round the then exact tie down to 1.0.
    x = np.array([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 1 + 2**-8, 3.0], dtype=np.float64)
    assert bf16_bits(x).tolist() == [0x3F81, 0xBF81, 0x3F80, 0x4040]


def test_bf16_bits_rejects_non_finite_values() -> None:
    with pytest.raises(ValueError, match="values must be finite"):
        bf16_bits(np.array([1.0, np.nan], dtype=np.float32))


def test_filler_bits_equal_rounding_each_value() -> None:
    index = np.arange(100_000, dtype=np.uint32)
    assert np.array_equal(filler_bits(5, index), bf16_bits(filler_values(5, index)))


def small_pool(referenced: list[int], planted: dict[int, float] | None = None) -> np.ndarray:
    planted = planted or {}
    slots = np.array(list(planted), dtype=np.int64)
    rows = (
        np.stack([np.full(576, v, dtype=np.float32) for v in planted.values()])
        if planted
        else np.zeros((0, 576))
    )
    return pool_bits(40, np.array(referenced), 77, slots, bf16_bits(rows.astype(np.float32)).reshape(-1, 576))


def test_unreferenced_slots_hold_nan() -> None:
    pool = small_pool([3, 5, 5, 39])
    nan_rows = [s for s in range(40) if (pool[s] == BF16_NAN_BITS).all()]
    assert nan_rows == [s for s in range(40) if s not in (3, 5, 39)]


def test_a_slot_filler_depends_only_on_seed_and_slot() -> None:
    a, b = small_pool([3, 5, 39]), small_pool([5, 1, 2, 3])
    assert np.array_equal(a[3], b[3]) and np.array_equal(a[5], b[5])
    index = (np.uint32(5 * 576) + np.arange(576, dtype=np.uint32)).astype(np.uint32)
    assert np.array_equal(a[5], filler_bits(77, index))


def test_planted_rows_overwrite_their_slots() -> None:
    pool = small_pool([3, 5], planted={5: 1.5})
    assert (pool[5] == 0x3FC0).all()  # 1.5 in bf16
    assert not (pool[3] == 0x3FC0).all()


def test_referenced_slot_outside_the_pool_is_rejected() -> None:
    with pytest.raises(ValueError, match="referenced slot 40 is outside the pool of 40 slots"):
        small_pool([1, 40])


@pytest.mark.parametrize("name", list(bundles.CANONICAL))
def test_materialised_pool_matches_the_stored_sha256(
    name: str, bundle: Callable[[str], bundles.Bundle]
) -> None:
    b = bundle(name)
    pool = materialise(b)
    assert pool.shape == (b.pool_slots, 576) and pool.dtype == torch.bfloat16
    assert pool_sha256(pool) == b.pool_sha256


def test_bundle_pool_is_finite_exactly_where_referenced(bundle: Callable[[str], bundles.Bundle]) -> None:
    b = bundle("ragged")
    pool = materialise(b)
    referenced = torch.zeros(b.pool_slots, dtype=torch.bool)
    referenced[b.kv_indices.long()] = True
    assert bool(torch.isfinite(pool[referenced]).all())
    assert bool(torch.isnan(pool[~referenced]).all())


def test_a_changed_planted_row_fails_the_sha256_check(bundle: Callable[[str], bundles.Bundle]) -> None:
    b = bundle("smoke")
    rows = b.planted_rows.clone()
    rows[0, 0] = rows[0, 0] + 1
    tampered = dataclasses.replace(b, planted_rows=rows)
    with pytest.raises(
        PoolMismatchError,
        match=rf"bundle 'smoke': the materialised pool has sha256 [0-9a-f]{{64}}, the bundle stores {b.pool_sha256}",
    ):
        materialise(tampered)


def test_pool_bytes_are_little_endian_bf16() -> None:
    pool = torch.tensor([[1.0, -2.0]], dtype=torch.bfloat16)
    import hashlib

    assert pool_sha256(pool) == hashlib.sha256(struct.pack("<HH", 0x3F80, 0xC000)).hexdigest()


@pytest.mark.slow
def test_materialising_the_200k_bundle_takes_at_most_10_s(bundle: Callable[[str], bundles.Bundle]) -> None:
    b = bundle("deepseek-v3-200k")
    start = time.perf_counter()
    materialise(b)
    assert time.perf_counter() - start <= 10.0
