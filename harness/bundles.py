"""Bundles: the canonical verify-attention test cases, small on disk, exact in what they check.

A bundle is a ``.pt`` file holding a plain dict (schema version 1), loaded only with
``torch.load(..., weights_only=True)``::

    schema_version   1
    name, description
    shapes           {num_requests B, num_heads H, num_tokens N, pool_slots S, qk_dim 576, v_dim 512}
    prefix_lens      int64 [B]
    qo_indptr        int32 [B+1]
    kv_indptr        int32 [B+1]
    parents          int32 [N]        request-local parent of each draft node (-1: root), laid out like q
    q                bf16  [N, H, 576]
    kv_indices       int32 [K]        a seeded scatter over a pool of S = ceil(1.25 K) + 17 slots
    planted_slots    int64 [R]        slots of the planted rows (sink, needles, draft keys)
    planted_rows     bf16  [R, 576]
    pool_seed, pool_sha256            the pool is rebuilt from these (harness.materialise)
    sm_scale         float
    recipe           dict of primitives: generate(recipe) rebuilds the bundle
    draft_tokens     int64 [N]
    goldens          {out fp32 [N, H, 512], lse fp32 [N, H] (float64 oracle, rounded),
                      target_tokens int64 [N], accepted_path [[node, ...] per request],
                      readout_seed, certified_margin}
    provenance       {generator, generator_version, torch, numpy}

Data that makes bugs visible (random keys give near-uniform attention where a dropped token or
a wrong mask changes nothing), per request with prefix P and T draft tokens:

    queries      q[i, h] = z + QUERY_BIAS * u + QUERY_CODE * e_i, z ~ N(0, 1) orthogonal to u and
                 the e's, rounded to bf16. u is the bundle's bias direction (for the sink); e_i is
                 the readout code of token tau_i (distinct per request) orthogonalised, shared by
                 every head of draft position i.
    sink         prefix position 0: key c * u with c set so that the sink holds SINK_SHARE of the
                 prefix's attention mass, given the filler's expected exp-score and P.
    needles      prefix positions 1, P-2, P-1, both sides of every power of two 16..131072 below P
                 (tile and split boundaries) and a few seeded middle positions. Each is aligned
                 with one (token, head) query for a score ln(P) + NEEDLE_BOOST, so it dominates that
                 row; every third one through the RoPE dims (512:576) alone.
    draft keys   draft node j's key has score (prefix lse + SELF_BOOST) for every head of its own
                 query (through e_j), and (prefix lse + DRAFT_BOOST) for head j % H of up to
                 DRAFT_ALIGN descendants, DRAFT_ALIGN later non-descendants and DRAFT_ALIGN_EARLIER
                 earlier tokens: whether token i sees j decides row (i, j % H) for those pairs, so a causal
                 mask, a cleared bit or a token shown a later draft token changes the answer.

The readout (harness.readout) maps each position's output to a token; because its own key
carries the code of tau_i in every head, the golden token has a margin far beyond what the
numeric tolerance can move, which is certified per position.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import math
import pickle
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import readout, tree
from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.cli import check_out_dir
from harness.materialise import (
    bf16_bits,
    bits_to_bf16,
    materialise,
    pool_bits,
    sha256_of_bits,
)
from harness.oracle import reference
from harness.results import atomic_write_bytes, atomic_write_text

SCHEMA_VERSION = 1
GENERATOR = "verify-attention/bundles"
GENERATOR_VERSION = 2  # 2: draft keys also aligned with earlier tokens
BUNDLES_DIR = Path(__file__).resolve().parent.parent / "bundles"
# DeepSeek-V3's softmax scale: 1 / sqrt(128 nope + 64 RoPE dims of the unabsorbed head).
SM_SCALE_V3 = 1 / math.sqrt(192)

QUERY_BIAS = 10.0
QUERY_CODE = 10.0
SINK_SHARE = 0.3
NEEDLE_BOOST = 3.0
SELF_BOOST = 0.5
DRAFT_BOOST = 1.0
DRAFT_ALIGN = 4
DRAFT_ALIGN_EARLIER = 2
MIDDLE_NEEDLES = 4
POOL_OVERHEAD = 1.25
POOL_EXTRA = 17
READOUT_ATTEMPTS = 16
# Variance of the filler: four uniform bytes, (4 * (256**2 - 1) / 12) / 256**2.
FILLER_VAR = 4 * (256**2 - 1) / 12 / 256**2
# Sub-streams of the recipe seed, one per use, so that changing one use leaves the others alone.
_STREAM = {
    "layout": 1,
    "bias": 2,
    "queries": 3,
    "needles": 4,
    "tokens": 5,
    "pool": 6,
    "readout": 7,
    "drafts": 8,
}

TREE_BUILDERS = {
    "chain": lambda num_draft, seed: tree.chain(num_draft),
    "ddtree": tree.ddtree,
    "eagle": tree.eagle_tree,
    "random": tree.random_tree,
}


def _recipe(
    name: str,
    description: str,
    seed: int,
    num_heads: int,
    requests: Sequence[tuple[int, str, int]],
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "seed": seed,
        "num_heads": num_heads,
        "sm_scale": SM_SCALE_V3,
        "requests": [
            {"prefix_len": p, "tree": kind, "num_draft": t, "tree_seed": seed * 100 + b}
            for b, (p, kind, t) in enumerate(requests)
        ],
    }


CANONICAL: dict[str, dict[str, Any]] = {
    r["name"]: r
    for r in (
        _recipe(
            "smoke", "one request, P=1000, a chain of 4 draft tokens, 8 heads", 1, 8, [(1000, "chain", 4)]
        ),
        _recipe(
            "ddtree",
            "one request, P=4093 (odd), a DDTree-like tree of 16, 16 heads",
            2,
            16,
            [(4093, "ddtree", 16)],
        ),
        _recipe(
            "ragged",
            "five requests: P in {0, 1, 777, 8192, 30001}, trees of {1, 4, 16, 33, 64}, 8 heads",
            3,
            8,
            [
                (0, "random", 1),
                (1, "random", 4),
                (777, "random", 16),
                (8192, "ddtree", 33),
                (30001, "eagle", 64),
            ],
        ),
        _recipe(
            "kimi-k2-tp8", "Kimi-K2 at TP8: P=65536, EAGLE tree of 16, 8 heads", 4, 8, [(65536, "eagle", 16)]
        ),
        _recipe(
            "two-long",
            "two long requests, P in {131072, 100003}, trees of {33, 16}, 64 heads",
            5,
            64,
            [(131072, "eagle", 33), (100003, "ddtree", 16)],
        ),
        _recipe(
            "deepseek-v3-200k",
            "DeepSeek-V3 at TP8: P=200000, EAGLE tree of 64, 16 heads",
            6,
            16,
            [(200000, "eagle", 64)],
        ),
    )
}


class BundleError(ValueError):
    """A bundle that cannot be used: unreadable, refused, wrong version or inconsistent."""


@dataclass(frozen=True, eq=False)
class Bundle:
    name: str
    description: str
    num_heads: int
    prefix_lens: tuple[int, ...]
    parents: tuple[tuple[int, ...], ...]
    q: torch.Tensor  # [N, H, 576] bf16
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [K] int32
    pool_slots: int
    pool_seed: int
    pool_sha256: str
    planted_slots: torch.Tensor  # [R] int64
    planted_rows: torch.Tensor  # [R, 576] bf16
    sm_scale: float
    recipe: dict[str, Any]
    draft_tokens: torch.Tensor  # [N] int64
    golden_out: torch.Tensor  # [N, H, 512] fp32
    golden_lse: torch.Tensor  # [N, H] fp32
    target_tokens: torch.Tensor  # [N] int64
    accepted_paths: tuple[tuple[int, ...], ...]
    readout_seed: int
    certified_margin: float
    provenance: dict[str, Any]

    @property
    def num_requests(self) -> int:
        return len(self.prefix_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[0])

    @property
    def num_draft(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.parents)

    def to_dict(self) -> dict[str, Any]:
        """The on-disk form: a plain dict of tensors, str, int, float, lists and dicts."""
        return _canonical(
            {
                "schema_version": SCHEMA_VERSION,
                "name": self.name,
                "description": self.description,
                "shapes": {
                    "num_requests": self.num_requests,
                    "num_heads": self.num_heads,
                    "num_tokens": self.num_tokens,
                    "pool_slots": self.pool_slots,
                    "qk_dim": QK_DIM,
                    "v_dim": V_DIM,
                },
                "prefix_lens": torch.tensor(self.prefix_lens, dtype=torch.int64),
                "qo_indptr": self.qo_indptr,
                "kv_indptr": self.kv_indptr,
                "parents": torch.tensor([p for tr in self.parents for p in tr], dtype=torch.int32),
                "q": self.q,
                "kv_indices": self.kv_indices,
                "planted_slots": self.planted_slots,
                "planted_rows": self.planted_rows,
                "pool_seed": self.pool_seed,
                "pool_sha256": self.pool_sha256,
                "sm_scale": self.sm_scale,
                "recipe": self.recipe,
                "draft_tokens": self.draft_tokens,
                "goldens": {
                    "out": self.golden_out,
                    "lse": self.golden_lse,
                    "target_tokens": self.target_tokens,
                    "accepted_path": [list(p) for p in self.accepted_paths],
                    "readout_seed": self.readout_seed,
                    "certified_margin": self.certified_margin,
                },
                "provenance": self.provenance,
            }
        )


def _canonical(obj: Any) -> Any:
    """A copy whose pickle depends on content only: pickle memoises strings by identity, so
    equal strings are made one object (interned), and each tensor gets its own exact storage
    (torch.save writes a view's whole storage)."""
    if isinstance(obj, dict):
        return {sys.intern(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, torch.Tensor):
        return obj.detach().contiguous().clone()
    return obj


# ---------------------------------------------------------------------------------------------
# Reading and checking


def _field(
    d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str, where: str = ""
) -> Any:
    name = f"{where}{key}"
    if key not in d:
        raise BundleError(f"{source}: missing field {name!r}")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BundleError(f"{source}: field {name!r} is a {type(value).__name__}, expected {expected}")
    return value


def _tensor(
    d: Mapping[str, Any], key: str, dtype: torch.dtype, shape: tuple[int, ...], source: str, where: str = ""
) -> torch.Tensor:
    t = _field(d, key, torch.Tensor, source, where)
    name = f"{where}{key}"
    if t.dtype != dtype:
        raise BundleError(f"{source}: field {name!r} has dtype {t.dtype}, expected {dtype}")
    if tuple(t.shape) != shape:
        raise BundleError(f"{source}: field {name!r} has shape {list(t.shape)}, expected {list(shape)}")
    return t.contiguous()


def _indptr(t: torch.Tensor, name: str, source: str) -> list[int]:
    values = [int(x) for x in t]
    if values[0] != 0:
        raise BundleError(f"{source}: {name}[0] = {values[0]}, expected 0")
    for b in range(len(values) - 1):
        if values[b + 1] < values[b]:
            raise BundleError(
                f"{source}: {name} is not monotonic: {name}[{b + 1}] = {values[b + 1]} < {name}[{b}] = {values[b]}"
            )
    return values


def _seed(d: Mapping[str, Any], key: str, source: str, where: str = "") -> int:
    value = _field(d, key, int, source, where)
    if not 0 <= value < 2**32:
        raise BundleError(
            f"{source}: field '{where}{key}' = {value}, expected 0 <= seed < 2**32 (it keys a 32-bit hash)"
        )
    return value


def _tokens(t: torch.Tensor, name: str, source: str) -> torch.Tensor:
    outside = torch.nonzero((t < 0) | (t >= readout.VOCAB))
    if outside.numel():
        i = int(outside[0])
        raise BundleError(
            f"{source}: field '{name}[{i}]' = {int(t[i])} is not a token, expected 0 <= token < {readout.VOCAB}"
        )
    return t


def _accepted_paths(
    goldens: Mapping[str, Any],
    parents: Sequence[tuple[int, ...]],
    qo_indptr: Sequence[int],
    draft_tokens: torch.Tensor,
    target_tokens: torch.Tensor,
    source: str,
) -> tuple[tuple[int, ...], ...]:
    """The golden accepted paths, checked: node indices inside each request's tree, each path the
    walk that the golden target tokens take over the draft tokens (else parity would fail every
    implementation against a corrupt golden)."""
    name = "goldens.accepted_path"
    walks = readout.accepted_paths(parents, qo_indptr, draft_tokens.numpy(), target_tokens.numpy())
    paths = _field(goldens, "accepted_path", list, source, "goldens.")
    b = len(parents)
    if len(paths) != b or not all(isinstance(p, list) and all(isinstance(x, int) for x in p) for p in paths):
        raise BundleError(f"{source}: field {name!r} must be {b} lists of node indices")
    for r, (path, tree_parents) in enumerate(zip(paths, parents, strict=True)):
        for k, node in enumerate(path):
            if not 0 <= node < len(tree_parents):
                raise BundleError(
                    f"{source}: field '{name}[{r}][{k}]' = {node} is outside request {r}'s tree of "
                    f"{len(tree_parents)} nodes"
                )
        if path != list(walks[r]):
            raise BundleError(
                f"{source}: field '{name}[{r}]' = {path}, but the golden target tokens walk request {r}'s "
                f"tree along {list(walks[r])} (fields 'draft_tokens' and 'goldens.target_tokens')"
            )
    return tuple(tuple(p) for p in paths)


def from_dict(d: Any, source: str = "bundle") -> Bundle:
    """Check an on-disk dict field by field and build the :class:`Bundle`; errors name the field."""
    if not isinstance(d, dict):
        raise BundleError(f"{source}: expected a dict at the top level, got {type(d).__name__}")
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(f"{source}: 'schema_version' is {version!r}, this reader handles {SCHEMA_VERSION}")
    shapes = _field(d, "shapes", dict, source)
    b = _field(shapes, "num_requests", int, source, "shapes.")
    h = _field(shapes, "num_heads", int, source, "shapes.")
    n = _field(shapes, "num_tokens", int, source, "shapes.")
    s = _field(shapes, "pool_slots", int, source, "shapes.")
    for key, want in (("qk_dim", QK_DIM), ("v_dim", V_DIM)):
        if _field(shapes, key, int, source, "shapes.") != want:
            raise BundleError(f"{source}: field 'shapes.{key}' is {shapes[key]}, expected {want}")
    for key, value in (("num_requests", b), ("num_heads", h)):
        if value < 1:
            raise BundleError(f"{source}: field 'shapes.{key}' = {value}, expected >= 1")
    if s < 1 or s * QK_DIM >= 2**32:
        raise BundleError(
            f"{source}: field 'shapes.pool_slots' = {s}, expected 1 <= pool_slots and "
            f"pool_slots * {QK_DIM} < 2**32 (slot * {QK_DIM} + dim is hashed in 32 bits)"
        )

    prefix_lens = [int(x) for x in _tensor(d, "prefix_lens", torch.int64, (b,), source)]
    if any(p < 0 for p in prefix_lens):
        raise BundleError(f"{source}: field 'prefix_lens' has a negative entry: {prefix_lens}")
    qo = _indptr(_tensor(d, "qo_indptr", torch.int32, (b + 1,), source), "qo_indptr", source)
    kv = _indptr(_tensor(d, "kv_indptr", torch.int32, (b + 1,), source), "kv_indptr", source)
    q = _tensor(d, "q", torch.bfloat16, (n, h, QK_DIM), source)
    if qo[-1] != n:
        raise BundleError(f"{source}: qo_indptr[-1] = {qo[-1]} but q has {n} rows (shape {list(q.shape)})")
    parents_flat = [int(x) for x in _tensor(d, "parents", torch.int32, (n,), source)]
    parents = []
    for r in range(b):
        t = qo[r + 1] - qo[r]
        if t < 1:
            raise BundleError(f"{source}: request {r} has {t} draft tokens (qo_indptr), expected >= 1")
        if kv[r + 1] - kv[r] != prefix_lens[r] + t:
            raise BundleError(
                f"{source}: kv_indptr[{r + 1}] - kv_indptr[{r}] = {kv[r + 1] - kv[r]}, expected "
                f"prefix_lens[{r}] + T = {prefix_lens[r]} + {t} (kv_indices vs kv_indptr)"
            )
        try:
            parents.append(tree.validate_parents(parents_flat[qo[r] : qo[r + 1]]))
        except ValueError as e:
            raise BundleError(
                f"{source}: request {r}: {e} (field 'parents' holds request-local indices)"
            ) from e
    kv_indices = _tensor(d, "kv_indices", torch.int32, (kv[-1],), source)
    if kv_indices.numel():
        lo, hi = int(kv_indices.min()), int(kv_indices.max())
        if lo < 0 or hi >= s:
            bad = int(torch.nonzero((kv_indices < 0) | (kv_indices >= s))[0])
            raise BundleError(
                f"{source}: kv_indices[{bad}] = {int(kv_indices[bad])} is outside the pool of {s} slots"
            )
    planted_shape = tuple(_field(d, "planted_slots", torch.Tensor, source).shape)
    if len(planted_shape) != 1:
        raise BundleError(f"{source}: field 'planted_slots' has shape {list(planted_shape)}, expected [R]")
    planted_slots = _tensor(d, "planted_slots", torch.int64, planted_shape, source)
    planted_rows = _tensor(d, "planted_rows", torch.bfloat16, (planted_slots.numel(), QK_DIM), source)
    if planted_slots.numel() and (int(planted_slots.min()) < 0 or int(planted_slots.max()) >= s):
        raise BundleError(f"{source}: field 'planted_slots' has a slot outside the pool of {s} slots")

    goldens = _field(d, "goldens", dict, source)
    draft_tokens = _tokens(_tensor(d, "draft_tokens", torch.int64, (n,), source), "draft_tokens", source)
    target_tokens = _tokens(
        _tensor(goldens, "target_tokens", torch.int64, (n,), source, "goldens."),
        "goldens.target_tokens",
        source,
    )
    return Bundle(
        name=_field(d, "name", str, source),
        description=_field(d, "description", str, source),
        num_heads=h,
        prefix_lens=tuple(prefix_lens),
        parents=tuple(parents),
        q=q,
        qo_indptr=torch.tensor(qo, dtype=torch.int32),
        kv_indptr=torch.tensor(kv, dtype=torch.int32),
        kv_indices=kv_indices,
        pool_slots=s,
        pool_seed=_seed(d, "pool_seed", source),
        pool_sha256=_field(d, "pool_sha256", str, source),
        planted_slots=planted_slots,
        planted_rows=planted_rows,
        sm_scale=float(_field(d, "sm_scale", float, source)),
        recipe=_field(d, "recipe", dict, source),
        draft_tokens=draft_tokens,
        golden_out=_tensor(goldens, "out", torch.float32, (n, h, V_DIM), source, "goldens."),
        golden_lse=_tensor(goldens, "lse", torch.float32, (n, h), source, "goldens."),
        target_tokens=target_tokens,
        accepted_paths=_accepted_paths(goldens, parents, qo, draft_tokens, target_tokens, source),
        readout_seed=_seed(goldens, "readout_seed", source, "goldens."),
        certified_margin=float(_field(goldens, "certified_margin", float, source, "goldens.")),
        provenance=_field(d, "provenance", dict, source),
    )


# The whole-file sha256 of each committed canonical bundle. The pool's sha256 sits inside the file
# it checks, so it vouches for the pool only: an edited q, kv_indices, tree or golden would load and
# pass it. This list lives apart from the files, and an edit of a file shows here in review.
MANIFEST = BUNDLES_DIR / "SHA256SUMS"


def read_manifest(path: Path | None = None) -> dict[str, str]:
    """``{file name: sha256}`` of the manifest (``<sha256>  <name>.pt`` lines); {} without one."""
    path = path or MANIFEST
    if not path.is_file():
        return {}
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name.endswith(".pt"):
            raise BundleError(f"{path}:{n}: expected '<sha256>  <name>.pt', got {line!r}")
        out[name] = digest
    return out


def write_manifest(entries: Mapping[str, str], path: Path | None = None) -> None:
    text = "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))
    atomic_write_text(path or MANIFEST, text)


def _committed_name(path: Path) -> str | None:
    """The canonical name of a file in the bundles folder (None for any other file)."""
    with contextlib.suppress(OSError):
        if path.resolve().parent == BUNDLES_DIR.resolve() and path.stem in CANONICAL and path.suffix == ".pt":
            return path.stem
    return None


def check_manifest(path: Path) -> None:
    """A canonical bundle in the bundles folder must hash to its manifest entry (BundleError)."""
    name = _committed_name(path)
    if name is None:
        return
    expected = read_manifest().get(path.name)
    if expected is None:
        raise BundleError(f"{path}: no entry in {MANIFEST.name} beside it; `bundles generate` writes one")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != expected:
        raise BundleError(
            f"{path}: its sha256 {got[:16]}... is not the {expected[:16]}... that {MANIFEST.name} "
            "records: the file was edited, or regenerated without updating the manifest "
            "(`python -m harness bundles generate` rewrites both; `bundles verify --regenerate` "
            "checks the file against its canonical recipe)"
        )


def bundle_path(name_or_path: str | Path) -> Path:
    """A canonical name ("smoke") resolves to bundles/<name>.pt; anything else is a path."""
    if isinstance(name_or_path, str) and name_or_path in CANONICAL:
        return BUNDLES_DIR / f"{name_or_path}.pt"
    return Path(name_or_path)


def load(name_or_path: str | Path) -> Bundle:
    """Read and check a bundle (``weights_only=True``: a file that needs code to load is refused)."""
    path = bundle_path(name_or_path)
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle file")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except zipfile.BadZipFile as e:
        raise BundleError(
            f"{path}: not a complete bundle archive (truncated, or not written by torch.save): {e}"
        ) from e
    if bad is not None:
        raise BundleError(f"{path}: record {bad!r} fails its CRC32 check (the file is corrupt)")
    check_manifest(path)
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [x.strip() for x in str(e).splitlines() if "Unsupported" in x or "WeightsUnpickler" in x]
        raise BundleError(
            f"{path}: refused: loading it needs code to run, and bundles load with weights_only=True "
            f"(only tensors and plain data). torch said: {lines[0] if lines else type(e).__name__}"
        ) from e
    except Exception as e:  # torch reports damaged archives as RuntimeError, EOFError, ...
        raise BundleError(f"{path}: cannot be read (truncated or corrupt?): {type(e).__name__}: {e}") from e
    return from_dict(d, source=str(path))


def to_bytes(bundle: Bundle) -> bytes:
    """The file's bytes: deterministic for identical content on the same software.

    Saved through an in-memory buffer so the archive's inner folder name is always "archive"
    (torch.save names it after the file, which would make a temp-file-then-rename write differ);
    the archive's serialization_id is derived from the records (checked by the tests).
    """
    buf = io.BytesIO()
    torch.save(bundle.to_dict(), buf)
    return buf.getvalue()


def save(bundle: Bundle, path: str | Path) -> Path:
    """Write the bundle atomically (a temp file renamed over ``path``)."""
    path = Path(path)
    atomic_write_bytes(path, to_bytes(bundle))  # a temp file of its own, removed on any error
    return path


def to_batch(bundle: Bundle, device: torch.device | str = "cpu") -> VerifyBatch:
    """The bundle as a :class:`VerifyBatch` on ``device``; materialises and checks the pool."""
    return VerifyBatch(
        q=bundle.q,
        kv_cache=materialise(bundle),
        kv_indices=bundle.kv_indices,
        qo_indptr=bundle.qo_indptr,
        kv_indptr=bundle.kv_indptr,
        prefix_lens=bundle.prefix_lens,
        parents=bundle.parents,
        sm_scale=bundle.sm_scale,
    ).to(device)


# ---------------------------------------------------------------------------------------------
# Generation


def _rng(seed: int, stream: str, *more: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _STREAM[stream], *more])))


def _seed32(seed: int, stream: str) -> int:
    return int(np.random.SeedSequence([seed, _STREAM[stream]]).generate_state(1)[0])


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float64 values rounded to bf16 (returned as float64)."""
    bits = bf16_bits(np.ascontiguousarray(x, dtype=np.float64))
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def needle_positions(prefix_len: int, rng: np.random.Generator) -> list[int]:
    """Prefix positions that get a needle: 1, P-2, P-1, B-1 and B for powers of two B in
    16..131072 below P, and MIDDLE_NEEDLES seeded positions in between (position 0 is the sink)."""
    p = prefix_len
    marks = {1, p - 2, p - 1}
    b = 16
    while b <= 131072 and b < p:
        marks |= {b - 1, b}
        b *= 2
    if p > 4:
        marks |= {int(x) for x in rng.integers(2, p - 2, size=MIDDLE_NEEDLES)}
    return sorted(m for m in marks if 1 <= m < p)


def draft_alignment(parents: Sequence[int], j: int) -> list[int]:
    """Draft nodes whose queries draft key j is aligned with: up to DRAFT_ALIGN later descendants
    (who must see j), DRAFT_ALIGN later non-descendants and DRAFT_ALIGN_EARLIER earlier nodes, the nearest
    first (who must not: no token sees a later one), so that a mask showing a token a later draft
    token changes the answer too."""
    vis = tree.visibility(parents)
    later = range(j + 1, len(parents))
    desc = [i for i in later if vis[i, j]][:DRAFT_ALIGN]
    other = [i for i in later if not vis[i, j]][:DRAFT_ALIGN]
    earlier = list(range(j - 1, -1, -1))[:DRAFT_ALIGN_EARLIER]
    return desc + other + earlier


def _aligned_key(direction: np.ndarray, score: float, query: np.ndarray, scale: float) -> np.ndarray:
    """The key along ``direction`` whose scaled dot product with ``query`` is ``score``."""
    return score / (scale * float(query @ direction)) * direction


@dataclass(frozen=True)
class _Planted:
    q_bits: np.ndarray  # [N, H, 576] uint16
    slots: np.ndarray  # [R] int64
    rows_bits: np.ndarray  # [R, 576] uint16


def planted_tokens(seed: int, request: int, num_draft: int) -> np.ndarray:
    """The token codes planted along request ``request``'s draft keys: its draft position j's own
    key points at token ``planted_tokens(...)[j]``, which its golden target token must then be."""
    return _rng(seed, "tokens", request).permutation(readout.VOCAB)[:num_draft]


def _plant(
    recipe: Mapping[str, Any],
    parents: Sequence[tuple[int, ...]],
    kv_indices: np.ndarray,
    kv_indptr: Sequence[int],
    readout_seed: int,
) -> _Planted:
    """Queries and planted key rows of every request (the data design of the module docstring)."""
    seed, h, scale = recipe["seed"], recipe["num_heads"], recipe["sm_scale"]
    codes = readout.codes(readout_seed)
    u = _rng(seed, "bias").standard_normal(QK_DIM)
    u /= np.linalg.norm(u)
    q_all, slots, rows = [], [], []
    for b, (req, par) in enumerate(zip(recipe["requests"], parents, strict=True)):
        p, t = req["prefix_len"], len(par)
        rng = _rng(seed, "queries", b)
        tokens = planted_tokens(seed, b, t)
        # e_i: the codes of this request's tokens, orthonormalised after u (so e_i is orthogonal to u).
        basis = np.zeros((QK_DIM, t + 1))
        basis[:, 0] = u
        basis[:V_DIM, 1:] = codes[tokens].T
        ortho, _ = np.linalg.qr(basis)
        ortho *= np.sign(np.sum(ortho * basis, axis=0))  # QR's signs are arbitrary: point along the inputs
        e = ortho[:, 1:].T  # [T, 576]
        z = rng.standard_normal((t, h, QK_DIM))
        z -= (z @ ortho) @ ortho.T
        q = _round_bf16(z + QUERY_BIAS * u + QUERY_CODE * e[:, None, :])  # [T, H, 576]
        q_all.append(q)
        base = kv_indptr[b]
        filler_mass = math.exp(scale**2 * float(np.mean(np.sum(q**2, axis=-1))) * FILLER_VAR / 2)
        planted: dict[int, np.ndarray] = {}
        if p >= 1:
            sink_score = max(math.log(SINK_SHARE / (1 - SINK_SHARE) * max(p - 1, 1) * filler_mass), 1.0)
            planted[0] = sink_score / (scale * float(np.mean(q @ u))) * u
            prefix_lse = math.log(math.exp(sink_score) + (p - 1) * filler_mass)
        else:
            prefix_lse = 0.0
        needle_rng = _rng(seed, "needles", b)
        positions = needle_positions(p, needle_rng)
        targets = needle_rng.permutation(t * h)
        for k, pos in enumerate(positions):
            ti, hi = divmod(int(targets[k % (t * h)]), h)
            score = math.log(p) + NEEDLE_BOOST
            zi = z[ti, hi]
            if k % 3 == 2:  # through the RoPE dims alone; the value part is orthogonal to the query's
                d = np.zeros(QK_DIM)
                d[V_DIM:] = zi[V_DIM:] / np.linalg.norm(zi[V_DIM:])
                row = _aligned_key(d, score, q[ti, hi], scale)
                value = needle_rng.standard_normal(V_DIM)
                qn = q[ti, hi, :V_DIM]
                value -= (value @ qn) / (qn @ qn) * qn
                row[:V_DIM] = value * (math.sqrt(FILLER_VAR * V_DIM) / np.linalg.norm(value))
            else:
                row = _aligned_key(zi / np.linalg.norm(zi), score, q[ti, hi], scale)
            planted[pos] = row
        for j in range(t):
            self_dir = e[j]
            row = (prefix_lse + SELF_BOOST) / (scale * float(np.mean(q[j] @ self_dir))) * self_dir
            later = draft_alignment(par, j)  # later and earlier tokens
            if later:
                # The shortest vector orthogonal to u and the e's with the same score for each
                # aligned query at head j % H.
                ys = q[later, j % h]
                ys = ys - (ys @ ortho) @ ortho.T
                k = ys.T @ np.linalg.solve(ys @ ys.T, np.ones(len(later)))
                row = row + (prefix_lse + DRAFT_BOOST) / scale * k
            planted[p + j] = row
        for pos, row in planted.items():
            slots.append(int(kv_indices[base + pos]))
            rows.append(row)
    return _Planted(
        q_bits=bf16_bits(np.concatenate(q_all)),
        slots=np.array(slots, dtype=np.int64),
        rows_bits=bf16_bits(np.stack(rows)),
    )


def check_recipe(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe as a plain dict, checked; errors name the field."""
    r = dict(recipe)
    for key, kind in (
        ("name", str),
        ("description", str),
        ("seed", int),
        ("num_heads", int),
        ("sm_scale", float),
    ):
        _field(r, key, kind, "recipe")
    if r["num_heads"] < 1:
        raise BundleError(f"recipe: num_heads = {r['num_heads']}, expected >= 1")
    if not 0 <= r["seed"] < 2**32:
        raise BundleError(f"recipe: seed = {r['seed']}, expected an int in [0, 2^32)")
    if not (math.isfinite(r["sm_scale"]) and r["sm_scale"] > 0):
        raise BundleError(f"recipe: sm_scale = {r['sm_scale']}, expected a finite positive number")
    requests = _field(r, "requests", list, "recipe")
    if not requests:
        raise BundleError("recipe: requests is empty, expected at least one request")
    for i, req in enumerate(requests):
        where = f"requests[{i}]."
        if not isinstance(req, Mapping):
            raise BundleError(
                f"recipe: {where[:-1]} is {type(req).__name__}, expected a table of prefix_len, num_draft, tree, tree_seed"
            )
        for key in ("prefix_len", "num_draft", "tree_seed"):
            _field(req, key, int, "recipe", where)
        if not 0 <= req["tree_seed"] < 2**32:
            raise BundleError(f"recipe: {where}tree_seed = {req['tree_seed']}, expected an int in [0, 2^32)")
        if _field(req, "tree", str, "recipe", where) not in TREE_BUILDERS:
            raise BundleError(
                f"recipe: {where}tree is {req['tree']!r}, expected one of {', '.join(TREE_BUILDERS)}"
            )
        if req["prefix_len"] < 0 or not 1 <= req["num_draft"] <= readout.VOCAB:
            raise BundleError(
                f"recipe: {where} prefix_len = {req['prefix_len']}, num_draft = {req['num_draft']}; expected "
                f"prefix_len >= 0 and 1 <= num_draft <= {readout.VOCAB} (each draft token has its own token code)"
            )
    return r


def generate(recipe: Mapping[str, Any], *, log: Callable[[str], object] | None = None) -> Bundle:
    """Build a bundle from its recipe: trees, layout, data, pool, float64 goldens, tokens."""
    r = check_recipe(recipe)
    seed, h = r["seed"], r["num_heads"]
    parents = [TREE_BUILDERS[req["tree"]](req["num_draft"], req["tree_seed"]) for req in r["requests"]]
    prefix_lens = [req["prefix_len"] for req in r["requests"]]
    qo = np.cumsum([0, *(len(p) for p in parents)])
    kv = np.cumsum([0, *(p + len(t) for p, t in zip(prefix_lens, parents, strict=True))])
    num_keys = int(kv[-1])
    pool_slots = math.ceil(POOL_OVERHEAD * num_keys) + POOL_EXTRA
    kv_indices = _rng(seed, "layout").permutation(pool_slots)[:num_keys].astype(np.int64)
    pool_seed = _seed32(seed, "pool")
    first_readout = _seed32(seed, "readout")
    for attempt in range(READOUT_ATTEMPTS):
        readout_seed = (first_readout + attempt) % 2**32
        planted = _plant(r, parents, kv_indices, [int(x) for x in kv], readout_seed)
        bits = pool_bits(pool_slots, kv_indices, pool_seed, planted.slots, planted.rows_bits)
        batch = VerifyBatch(
            q=bits_to_bf16(planted.q_bits),
            kv_cache=bits_to_bf16(bits),
            kv_indices=torch.from_numpy(kv_indices.astype(np.int32)),
            qo_indptr=torch.from_numpy(qo.astype(np.int32)),
            kv_indptr=torch.from_numpy(kv.astype(np.int32)),
            prefix_lens=tuple(prefix_lens),
            parents=tuple(parents),
            sm_scale=r["sm_scale"],
        )
        out, lse = reference(batch)
        # Certified on the goldens as stored (fp32), which parity compares against: the same
        # float on every CPU (harness/readout.py), where the float64 oracle's own last bits need not be.
        margin = float(readout.certified_ratios(out.to(torch.float32), readout_seed).min())
        if log:
            log(f"{r['name']}: readout seed {readout_seed}: certified margin {margin:.2f}")
        if margin > readout.KAPPA:
            break
    else:
        raise BundleError(
            f"recipe {r['name']!r}: no readout seed of {READOUT_ATTEMPTS} certifies every position "
            f"(last margin {margin:.3f}, need > {readout.KAPPA})"
        )
    targets = readout.target_tokens(out, readout_seed)
    draft = np.concatenate(
        [
            readout.draft_tokens_for(par, targets[qo[b] : qo[b + 1]], _rng(seed, "drafts", b))
            for b, par in enumerate(parents)
        ]
    )
    paths = readout.accepted_paths(parents, qo, draft, targets)
    return Bundle(
        name=r["name"],
        description=r["description"],
        num_heads=h,
        prefix_lens=tuple(prefix_lens),
        parents=tuple(parents),
        q=batch.q,
        qo_indptr=batch.qo_indptr,
        kv_indptr=batch.kv_indptr,
        kv_indices=batch.kv_indices,
        pool_slots=pool_slots,
        pool_seed=pool_seed,
        pool_sha256=sha256_of_bits(bits),
        planted_slots=torch.from_numpy(planted.slots),
        planted_rows=bits_to_bf16(planted.rows_bits),
        sm_scale=r["sm_scale"],
        recipe=r,
        draft_tokens=torch.from_numpy(draft),
        golden_out=out.to(torch.float32),
        golden_lse=lse.to(torch.float32),
        target_tokens=torch.from_numpy(targets),
        accepted_paths=tuple(tuple(p) for p in paths),
        readout_seed=readout_seed,
        certified_margin=margin,
        provenance={
            "generator": GENERATOR,
            "generator_version": GENERATOR_VERSION,
            "torch": str(torch.__version__),
            "numpy": str(np.__version__),
        },
    )


# ---------------------------------------------------------------------------------------------
# CLI: python -m harness bundles {list, generate, verify}


def _names(text: str | None) -> list[str]:
    """``--bundles``: canonical names, comma-separated, each once (default: all; an empty value is
    not "all"); raises ValueError."""
    if text is None:
        return list(CANONICAL)
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in CANONICAL]
    if not names:
        raise ValueError(f"--bundles {text!r} names no bundle; known: {', '.join(CANONICAL)}")
    if unknown:
        raise ValueError(f"--bundles: unknown bundle(s) {', '.join(unknown)}; known: {', '.join(CANONICAL)}")
    return names


def _checked_args(
    command: Callable[[argparse.Namespace, list[str]], int],
) -> Callable[[argparse.Namespace], int]:
    """``command`` called with the ``--bundles`` names, after its arguments are checked: a bad
    argument exits 2 with its message, before any work."""

    def run(args: argparse.Namespace) -> int:
        try:
            names = _names(args.bundles)
            if getattr(args, "out", None) is not None:
                check_out_dir(args.out)
        except ValueError as e:
            print(f"bundles: {e}", file=sys.stderr)
            return 2
        return command(args, names)

    return run


def _cmd_list(args: argparse.Namespace, names: list[str]) -> int:
    for name in names:
        path = bundle_path(name)
        size = f"{path.stat().st_size / 2**20:6.2f} MB" if path.is_file() else "   missing"
        print(f"{name:18s} {size}  {CANONICAL[name]['description']}")
    return 0


def _cmd_generate(args: argparse.Namespace, names: list[str]) -> int:
    out_dir = Path(args.out)
    taken = [out_dir / f"{n}.pt" for n in names if (out_dir / f"{n}.pt").is_dir()]
    if taken:  # before minutes of generating
        print(
            f"bundles: --out {out_dir}: {', '.join(p.name for p in taken)} there "
            f"{'is a folder' if len(taken) == 1 else 'are folders'}; expected a bundle file or nothing",
            file=sys.stderr,
        )
        return 2
    kept = []
    for name in names:
        bundle = generate(CANONICAL[name], log=print)
        path = out_dir / f"{name}.pt"
        data = to_bytes(bundle)
        if path.is_file() and path.read_bytes() == data:
            done = f"{path} unchanged (regenerated bytes identical)"
        elif path.is_file() and not args.force:
            # A file of other bytes is another generator's (torch, numpy) or an edited one: the
            # goldens parity trusts are not replaced without asking.
            kept.append(path)
            print(
                f"bundles: {path} exists with other bytes than {name}'s recipe regenerates here; kept as it "
                "is (pass --force to replace it; `bundles verify --regenerate` compares them)",
                file=sys.stderr,
            )
            continue
        else:
            try:
                atomic_write_bytes(path, data)
            except OSError as e:
                print(
                    f"bundles: --out {out_dir}: cannot write {name}.pt there ({e.strerror or e}); "
                    "expected a writable folder",
                    file=sys.stderr,
                )
                return 2
            done = f"wrote {path} ({len(data) / 2**20:.2f} MB)"
        if _committed_name(path) is not None:  # the committed set: its manifest follows the file
            digest = hashlib.sha256(data).hexdigest()
            if read_manifest().get(path.name) != digest:
                write_manifest({**read_manifest(), path.name: digest})
        print(f"{name}: {done}, margin {bundle.certified_margin:.2f}")
    return 1 if kept else 0


def _cmd_verify(args: argparse.Namespace, names: list[str]) -> int:
    failures = 0
    for name in names:
        path = bundle_path(name)
        try:
            bundle = load(path)
            materialise(bundle)
            status = "pool sha256 ok"
            if args.regenerate:  # from the canonical recipe, not the file's own (which it could carry edited)
                same = to_bytes(generate(CANONICAL[name])) == path.read_bytes()
                status += ", regenerated bytes identical" if same else ", REGENERATED BYTES DIFFER"
                failures += not same
        except (BundleError, ValueError) as e:
            status = f"FAILED: {e}"
            failures += 1
        print(f"{name}: {status}")
    return 1 if failures else 0


def register_cli(sub: Any) -> None:
    parser = sub.add_parser("bundles", help="list, generate or verify the canonical bundles")
    cmds = parser.add_subparsers(dest="bundles_command", required=True)
    p = cmds.add_parser("list", help="the canonical bundles and their sizes")
    p.add_argument("--bundles", help="comma-separated names (default: all)")
    p.set_defaults(func=_checked_args(_cmd_list))
    p = cmds.add_parser(
        "generate", help="rebuild bundles from their recipes (float64 goldens: minutes on a CPU)"
    )
    p.add_argument("--bundles", help="comma-separated names (default: all)")
    p.add_argument("--out", default=str(BUNDLES_DIR), help="output folder (default: bundles/)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a bundle file whose bytes differ from the regenerated ones (default: keep it and exit 1)",
    )
    p.set_defaults(func=_checked_args(_cmd_generate))
    p = cmds.add_parser("verify", help="load each bundle and check its materialised pool's sha256")
    p.add_argument("--bundles", help="comma-separated names (default: all)")
    p.add_argument("--regenerate", action="store_true", help="also regenerate and compare the bytes")
    p.set_defaults(func=_checked_args(_cmd_verify))
