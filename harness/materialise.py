"""The KV pool of a bundle, rebuilt bit-identically on any machine, torch version and device.

A bundle does not store its pool (hundreds of MB); it stores a recipe and a sha256 of the
pool's bytes. The pool is:

    filler     slot s, dim d referenced by some request: an Irwin-Hall value of the four bytes
               of x = hash32(pool_seed, s * 576 + d):  (byte0 + byte1 + byte2 + byte3 - 510) / 256
               (mean 0, std 0.577), exact in float32, rounded to bf16 by round-to-nearest-even
    NaN        every slot no request references holds bf16 NaN (0x7FC0), so an out-of-range
               read poisons the output instead of passing unnoticed
    planted    rows stored in the bundle (sink, needles, draft keys) overwrite their slots

Only integer arithmetic with wrapping uint32 (defined in numpy) and exact float32 steps are
used: no transcendental functions, no float RNG, no library float -> bf16 conversion, so the
bytes do not depend on the machine, the numpy/torch version or the device.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from harness.batch import QK_DIM

if TYPE_CHECKING:
    from harness.bundles import Bundle

BF16_NAN_BITS = 0x7FC0
# Elements hashed per step: bounds the temporaries to a few hundred MB whatever the pool size.
CHUNK_ELEMENTS = 8 * 1024 * 1024
_U32 = np.uint32


class PoolMismatchError(ValueError):
    """A materialised pool whose sha256 differs from the one stored in its bundle."""


def lowbias32(x: np.ndarray) -> np.ndarray:
    """A 32-bit xorshift-multiply mixer (C. Wellons' "lowbias32" constants), in place on uint32."""
    if x.dtype != np.uint32:
        raise TypeError(f"lowbias32: x must be uint32, got {x.dtype}")
    x ^= x >> _U32(16)
    x *= _U32(0x7FEB352D)
    x ^= x >> _U32(15)
    x *= _U32(0x846CA68B)
    x ^= x >> _U32(16)
    return x


def _seed_keys(seed: int) -> tuple[np.uint32, np.uint32]:
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed = {seed}; expected 0 <= seed < 2**32")
    k = lowbias32(np.array([seed, seed ^ 0x9E3779B9], dtype=np.uint32))
    return k[0], k[1]


def hash32(seed: int, index: np.ndarray) -> np.ndarray:
    """uint32 hash of (seed, index) for a uint32 ``index`` array (a new array; index untouched).

    Two mixer rounds keyed by the seed, so that two seeds do not give index-shuffled copies of
    one stream (which a single ``mix(index ^ key)`` would).
    """
    k1, k2 = _seed_keys(seed)
    x = np.bitwise_xor(index.astype(np.uint32, copy=False), k1)
    lowbias32(x)
    x += k2
    return lowbias32(x)


def byte_sum(x: np.ndarray) -> np.ndarray:
    """Sum of the four bytes of each uint32, in [0, 1020] (pairs of bytes summed in 16-bit lanes)."""
    pairs = (x & _U32(0x00FF00FF)) + ((x >> _U32(8)) & _U32(0x00FF00FF))
    return (pairs & _U32(0xFFFF)) + (pairs >> _U32(16))


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) of finite float32 or float64 values, round-to-nearest-even.

    Works on the bit pattern: add half an ulp of bf16 (minus one, plus the lowest kept bit for
    ties to even) and truncate. float64 is rounded to bf16's 8 significant bits first, which is
    then exact in float32, so there is a single rounding (no float64 -> float32 -> bf16 double
    rounding).
    """
    if not np.isfinite(values).all():
        raise ValueError("bf16_bits: values must be finite (NaN slots are written as bits directly)")
    if values.dtype == np.float64:
        tiny = (values != 0) & (np.abs(values) < 2.0**-126)
        if tiny.any():
            raise ValueError(
                "bf16_bits: nonzero float64 values below 2**-126 (bf16 subnormals) are not handled"
            )
        bits = values.view(np.uint64)
        drop = np.uint64(45)  # 52 float64 mantissa bits - 7 bf16 mantissa bits
        bits = bits + (np.uint64(2**44 - 1) + ((bits >> drop) & np.uint64(1)))
        bits &= ~np.uint64(2**45 - 1)
        values = bits.view(np.float64).astype(np.float32)  # exact: 8 significant bits
        return (values.view(np.uint32) >> _U32(16)).astype(np.uint16)
    if values.dtype != np.float32:
        raise TypeError(f"bf16_bits: values must be float32 or float64, got {values.dtype}")
    bits = values.view(np.uint32)
    bits = bits + (_U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1)))
    return (bits >> _U32(16)).astype(np.uint16)


def bits_to_bf16(bits: np.ndarray) -> torch.Tensor:
    """A CPU bf16 tensor of uint16 bit patterns (any shape), sharing memory with ``bits``."""
    if bits.dtype != np.uint16:
        raise TypeError(f"bits_to_bf16: bits must be uint16, got {bits.dtype}")
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def bf16_to_bits(t: torch.Tensor) -> np.ndarray:
    """uint16 bit patterns of a bf16 tensor (copied to the CPU)."""
    if t.dtype != torch.bfloat16:
        raise TypeError(f"bf16_to_bits: expected a bfloat16 tensor, got {t.dtype}")
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


# bf16 bits of every filler value (k - 510) / 256, k in [0, 1020]: the float32 value is exact and
# rounded once by bf16_bits, so a table lookup gives the same bits as rounding each element.
_FILLER_BF16 = bf16_bits((np.arange(1021, dtype=np.float32) - np.float32(510)) * np.float32(2**-8))


def filler_values(seed: int, index: np.ndarray) -> np.ndarray:
    """The filler as float32 (exact, before bf16 rounding) for a uint32 ``index`` array."""
    return (byte_sum(hash32(seed, index)).astype(np.float32) - np.float32(510)) * np.float32(2**-8)


def filler_bits(seed: int, index: np.ndarray) -> np.ndarray:
    """The filler's bf16 bit patterns (uint16) for a uint32 ``index`` array."""
    return _FILLER_BF16[byte_sum(hash32(seed, index))]


def pool_bits(
    pool_slots: int,
    referenced: np.ndarray,
    seed: int,
    planted_slots: np.ndarray,
    planted_bits: np.ndarray,
) -> np.ndarray:
    """The pool as uint16 bf16 bit patterns [pool_slots, 576].

    referenced     int64 slots some request reads (any order, repeats allowed): filler
    planted_slots  int64 [R] slots overwritten by planted_bits [R, 576] (uint16)
    every other slot: bf16 NaN
    """
    if pool_slots * QK_DIM >= 2**32:
        raise ValueError(f"pool_slots = {pool_slots}: slot * 576 + dim must fit in 32 bits for the hash")
    referenced = np.unique(np.asarray(referenced, dtype=np.int64))
    if referenced.size and (referenced[0] < 0 or referenced[-1] >= pool_slots):
        bad = referenced[0] if referenced[0] < 0 else referenced[-1]
        raise ValueError(f"referenced slot {bad} is outside the pool of {pool_slots} slots")
    if planted_bits.shape != (planted_slots.shape[0], QK_DIM):
        raise ValueError(
            f"planted rows have shape {planted_bits.shape}, expected ({planted_slots.shape[0]}, {QK_DIM}) "
            "to match planted slots"
        )
    pool = np.full((pool_slots, QK_DIM), BF16_NAN_BITS, dtype=np.uint16)
    dims = np.arange(QK_DIM, dtype=np.uint32)
    step = max(1, CHUNK_ELEMENTS // QK_DIM)
    for start in range(0, referenced.size, step):
        slots = referenced[start : start + step]
        index = (slots.astype(np.uint32)[:, None] * _U32(QK_DIM) + dims).reshape(-1)
        pool[slots] = filler_bits(seed, index).reshape(-1, QK_DIM)
    pool[np.asarray(planted_slots, dtype=np.int64)] = planted_bits
    return pool


def sha256_of_bits(bits: np.ndarray) -> str:
    """sha256 hex digest of uint16 values as little-endian bytes (the pool's raw bf16 bytes)."""
    return hashlib.sha256(np.ascontiguousarray(bits, dtype="<u2").tobytes()).hexdigest()


def pool_sha256(kv_cache: torch.Tensor) -> str:
    """sha256 of a bf16 pool's raw bytes (little-endian), wherever the tensor lives."""
    return sha256_of_bits(bf16_to_bits(kv_cache))


def materialise(bundle: Bundle, device: torch.device | str = "cpu") -> torch.Tensor:
    """The bundle's KV pool [pool_slots, 576] bf16 on ``device``, checked against its sha256.

    Built on the CPU (the only path, so every device gets the same bytes), then moved.
    """
    bits = pool_bits(
        bundle.pool_slots,
        bundle.kv_indices.numpy().astype(np.int64),
        bundle.pool_seed,
        bundle.planted_slots.numpy(),
        bf16_to_bits(bundle.planted_rows),
    )
    digest = sha256_of_bits(bits)
    if digest != bundle.pool_sha256:
        raise PoolMismatchError(
            f"bundle {bundle.name!r}: the materialised pool has sha256 {digest}, the bundle stores "
            f"{bundle.pool_sha256}: the file was edited, or the pool recipe or the generator changed"
        )
    return bits_to_bf16(bits).to(device)
