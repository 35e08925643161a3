"""The verify-attention problem as one value: a ragged batch of (prefix, draft tree) requests.

Every implementation in the registry takes a :class:`VerifyBatch` and returns ``(out, lse)``.
Shapes (DESIGN.md section 1):

    q          [N, H, 576]  bf16   N = sum(num_draft); 576 = 512 latent + 64 RoPE
    kv_cache   [S, 576]     bf16   page_size=1 pool; V is the first 512 dims of each row
    kv_indices [K]          int32  request b's slots, prefix first then its draft tokens,
                                   at kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    qo_indptr  [B+1]        int32
    kv_indptr  [B+1]        int32
    -> out     [N, H, 512], lse [N, H] fp32 (natural log of the softmax denominator)

The tree of request b is ``parents[b]``: ``parents[b][i]`` is the parent of draft node i
(``-1`` for the root, node 0) and always comes before it. Draft node i sees the whole
prefix, itself and its ancestors.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

QK_DIM = 576
V_DIM = 512
ROPE_DIM = QK_DIM - V_DIM


@dataclass(frozen=True)
class VerifyBatch:
    q: torch.Tensor  # [N, H, 576] bf16
    kv_cache: torch.Tensor  # [S, 576] bf16
    kv_indices: torch.Tensor  # [K] int32
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32
    prefix_lens: tuple[int, ...]  # P_b per request
    parents: tuple[tuple[int, ...], ...]  # per request, parent of each draft node (-1 = root)
    sm_scale: float

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def num_draft(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.parents)

    @property
    def device(self) -> torch.device:
        return self.q.device

    def to(self, device: torch.device | str) -> VerifyBatch:
        """The same batch with every tensor on ``device`` (host metadata unchanged)."""
        return VerifyBatch(
            q=self.q.to(device),
            kv_cache=self.kv_cache.to(device),
            kv_indices=self.kv_indices.to(device),
            qo_indptr=self.qo_indptr.to(device),
            kv_indptr=self.kv_indptr.to(device),
            prefix_lens=self.prefix_lens,
            parents=self.parents,
            sm_scale=self.sm_scale,
        )

    def pool(self) -> torch.Tensor:
        """``kv_cache`` as [S, 576] (a [S, 1, 576] pool is viewed so); raises naming it otherwise."""
        cache = self.kv_cache
        if cache.dim() == 3 and cache.shape[1] == 1:
            cache = cache.view(cache.shape[0], cache.shape[2])
        if cache.dim() != 2 or cache.shape[1] != QK_DIM:
            raise ValueError(
                f"kv_cache has shape {tuple(self.kv_cache.shape)}, expected [S, {QK_DIM}] or [S, 1, {QK_DIM}]"
            )
        return cache

    def host_indptrs(self) -> tuple[list[int], list[int]]:
        """(qo_indptr, kv_indptr) on the host, checked against q, prefix_lens, the trees,
        kv_indices and the pool: every error names its field."""
        for name in ("qo_indptr", "kv_indptr", "kv_indices"):
            t = getattr(self, name)
            if (
                not isinstance(t, torch.Tensor)
                or t.dim() != 1
                or t.is_floating_point()
                or t.dtype == torch.bool
            ):
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 1-D integer tensor, got {got}")
        qo = [int(x) for x in self.qo_indptr.cpu()]
        kv = [int(x) for x in self.kv_indptr.cpu()]
        if len(qo) != self.batch_size + 1 or len(kv) != self.batch_size + 1:
            raise ValueError(
                f"qo_indptr has {len(qo)} and kv_indptr {len(kv)} entries, expected B + 1 = {self.batch_size + 1}"
            )
        if qo[0] != 0 or kv[0] != 0:
            raise ValueError(f"qo_indptr[0] = {qo[0]} and kv_indptr[0] = {kv[0]}; both must be 0")
        if self.q.dim() != 3 or self.q.shape[2] != QK_DIM or qo[-1] != self.q.shape[0] or self.q.shape[1] < 1:
            raise ValueError(
                f"q has shape {tuple(self.q.shape)}, expected [qo_indptr[-1] = {qo[-1]}, H >= 1, {QK_DIM}]"
            )
        for b, (p, parents) in enumerate(zip(self.prefix_lens, self.parents, strict=True)):
            if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 0:  # numpy's too
                raise ValueError(f"prefix_lens[{b}] = {p!r}; expected an int >= 0")
            t = len(parents)
            if qo[b + 1] - qo[b] != t:
                raise ValueError(
                    f"request {b}: qo_indptr gives {qo[b + 1] - qo[b]} queries, its tree has {t} nodes"
                )
            if kv[b + 1] - kv[b] != p + t:
                raise ValueError(
                    f"request {b}: kv_indptr gives {kv[b + 1] - kv[b]} keys, expected P + T = {p} + {t}"
                )
        if kv[-1] > self.kv_indices.numel():
            raise ValueError(
                f"kv_indptr[-1] = {kv[-1]} is past the end of kv_indices ({self.kv_indices.numel()} slots)"
            )
        num_slots = self.pool().shape[0]
        used = self.kv_indices[: kv[-1]]
        if used.numel() and not (0 <= int(used.min()) and int(used.max()) < num_slots):
            bad = int(torch.nonzero((used < 0) | (used >= num_slots))[0])
            raise ValueError(
                f"kv_indices[{bad}] = {int(used[bad])} is outside the pool: expected a slot in [0, {num_slots})"
            )
        return qo, kv

    def kv_bytes(self) -> int:
        """Bytes of KV rows read once: every row the indptrs address, each distinct slot once
        (576 bf16 each). Entries of an over-allocated ``kv_indices`` past ``kv_indptr[-1]`` are
        not read, and a slot two requests share is one row of the pool."""
        _, kv = self.host_indptrs()
        used = self.kv_indices[: kv[-1]]
        return int(torch.unique(used).numel()) * QK_DIM * 2

    def min_bytes(self) -> int:
        """The fewest bytes the operation must move: KV rows once + q + out (bf16)."""
        n, h = int(self.q.shape[0]), self.num_heads
        return self.kv_bytes() + n * h * QK_DIM * 2 + n * h * V_DIM * 2

    def flops(self) -> int:
        """2 * H * T * (P + T) * (576 + 512) summed over requests (DESIGN.md section 5)."""
        h = self.num_heads
        return sum(
            2 * h * len(par) * (p + len(par)) * (QK_DIM + V_DIM)
            for p, par in zip(self.prefix_lens, self.parents, strict=True)
        )
