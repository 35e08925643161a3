"""The CUDA kernel against the float64 oracle: fuzz, determinism, CUDA graphs, bad input.

All tests here need a CUDA GPU (``gpu`` marker). Each fuzz case is a fresh random batch: ragged
prefixes (0, 1, unaligned, up to 256k), trees and chains of 1..256 draft tokens, 1..128 heads,
up to 16 requests, slots scattered over a pool whose unreferenced rows hold NaN.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fuzz_env import CONFIG_SEEDS, SEED_VAR, fuzz_seed, fuzz_settings

from harness.batch import QK_DIM, VerifyBatch
from harness.oracle import reference
from harness.timing import capture_graph
from harness.tree import chain, random_tree

pytestmark = pytest.mark.gpu

REL_TOL, COS_TOL, LSE_TOL = 1e-2, 0.9999, 1e-3
SM_SCALE = 1 / math.sqrt(192)
HEADS = (1, 2, 8, 16, 64, 128)
# float64 oracle work per case (rows x keys) stays under this, so 300+ cases take seconds.
WORK_CAP = 6e7


def random_shape(rng: random.Random, work_cap: float = WORK_CAP) -> tuple[list[int], list[int], int]:
    """(prefix lens, draft counts, heads) of a random ragged batch within ``work_cap`` rows x keys."""
    while True:
        h = rng.choice(HEADS)
        b = rng.choice((1, 1, 2, 3, 5, 8, 16))
        kind = rng.random()
        num_draft = [rng.choice((1, 2, 4, 7, 16, 33, 64, 100, 256)) for _ in range(b)]
        if kind < 0.15:
            prefix = [rng.choice((0, 1)) for _ in range(b)]
        elif kind < 0.8:
            prefix = [rng.randint(0, 5000) for _ in range(b)]
        else:
            prefix = [rng.choice((32768, 65536 + 7, 131071, 200000, 262144)) for _ in range(b)]
        if sum(t * h * (p + t) for p, t in zip(prefix, num_draft, strict=True)) <= work_cap:
            return prefix, num_draft, h


def make_batch(
    rng: random.Random, device: torch.device, prefix: list[int], num_draft: list[int], num_heads: int
) -> VerifyBatch:
    """Random q and KV rows, drawn on the device; slots scattered (or, now and then, contiguous)
    over a larger pool whose unreferenced rows hold NaN; random trees and chains."""
    parents = tuple(
        chain(t) if rng.random() < 0.3 else random_tree(t, rng.randrange(2**31)) for t in num_draft
    )
    kv_lens = [p + t for p, t in zip(prefix, num_draft, strict=True)]
    total_kv = sum(kv_lens)
    pool = total_kv + rng.randint(1, max(1, total_kv // 4)) + 3
    g = torch.Generator(device=device).manual_seed(rng.randrange(2**31))
    kv_cache = torch.full((pool, QK_DIM), float("nan"), dtype=torch.bfloat16, device=device)
    if rng.random() < 0.25:
        slots = torch.arange(total_kv, device=device) + (pool - total_kv)
    else:
        slots = torch.randperm(pool, generator=g, device=device)[:total_kv]
    kv_cache[slots] = torch.randn(total_kv, QK_DIM, generator=g, device=device).to(torch.bfloat16)
    q = torch.randn(sum(num_draft), num_heads, QK_DIM, generator=g, device=device).to(torch.bfloat16)

    def indptr(lens: list[int]) -> torch.Tensor:
        return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)

    return VerifyBatch(
        q=q,
        kv_cache=kv_cache,
        kv_indices=slots.to(torch.int32),
        qo_indptr=indptr(num_draft),
        kv_indptr=indptr(kv_lens),
        prefix_lens=tuple(prefix),
        parents=parents,
        sm_scale=SM_SCALE,
    )


def random_batch(rng: random.Random, device: torch.device, work_cap: float = WORK_CAP) -> VerifyBatch:
    return make_batch(rng, device, *random_shape(rng, work_cap))


def assert_close(out: torch.Tensor, lse: torch.Tensor, batch: VerifyBatch, label: str) -> None:
    ref_out, ref_lse = reference(batch)
    out64 = out.double().flatten(0, 1)
    ref = ref_out.double().flatten(0, 1)
    assert torch.isfinite(out64).all(), f"{label}: non-finite output"
    err = (out64 - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    # Rows scaled to unit reference norm first: cosine_similarity clamps tiny norms (eps 1e-8), which
    # would read outputs near 2^-100 as orthogonal.
    unit = ref.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    cos = torch.nn.functional.cosine_similarity(out64 / unit, ref / unit, dim=-1)
    lse_err = (lse.double().flatten() - ref_lse.double().flatten()).abs()
    worst = int(err.argmax())
    h = batch.num_heads
    assert err.max() <= REL_TOL, f"{label}: rel err {err.max():.3e} at token {worst // h} head {worst % h}"
    assert cos.min() >= COS_TOL, f"{label}: cosine {cos.min():.6f}"
    assert lse_err.max() <= LSE_TOL, f"{label}: lse err {lse_err.max():.3e}"


def run_kernel(
    batch: VerifyBatch,
    config: str = "auto",
    validate: bool = True,
    *,
    q: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    extra_mask_words: int = 0,
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
):
    """The kernel on ``batch``; q and kv_indices may be given instead of the batch's (longer ones,
    for over-allocated buffers), the packed tree mask may get extra words past its indptr, the
    call may be laid out for another SM count, and it may write into given outputs."""
    import kernel

    mask, mask_indptr = kernel.pack_parents(batch.parents)
    mask = torch.cat([mask, torch.full((extra_mask_words,), -1, dtype=mask.dtype)])  # every bit set
    return kernel.verify_attention(
        batch.q if q is None else q,
        batch.kv_cache,
        batch.kv_indices if kv_indices is None else kv_indices,
        batch.qo_indptr,
        batch.kv_indptr,
        mask.to(batch.device),
        mask_indptr.to(batch.device),
        batch.sm_scale,
        validate=validate,
        config=config,
        num_sms=num_sms,
        out=out,
        lse=lse,
    )


def describe(batch: VerifyBatch) -> str:
    return f"B{batch.batch_size}-P{list(batch.prefix_lens)}-T{list(batch.num_draft)}-H{batch.num_heads}"


# Every value of verify_attention's `config`: "auto" and the six tile configs.
TILE_CONFIGS = ("wgmma-ws", "wgmma-ws-pipe", "wgmma", "large", "small", "small-m32")
WGMMA_CONFIGS = ("wgmma-ws", "wgmma-ws-pipe", "wgmma")
CONFIGS = ("auto", *TILE_CONFIGS)


def runs_wgmma() -> bool:
    """The wgmma config runs on this GPU: compute capability 9.0 (the build adds sm_90a there)."""
    return torch.cuda.get_device_capability() == (9, 0)


@functools.cache
def fits_shared_memory(config: str) -> bool:
    """This GPU's per-block shared-memory limit holds ``config`` (sm_120's 99 KB does not hold
    `large`, 162 KB). The launcher refuses such a config with an error that says so; a tiny call
    asks it, so the tests and the launcher cannot disagree."""
    batch = make_batch(random.Random(0), torch.device("cuda"), [40], [2], 1)
    try:
        run_kernel(batch, config=config)
    except RuntimeError as e:
        if "bytes of shared memory per block" in str(e):
            return False
        raise
    return True


def gpu_configs() -> tuple[str, ...]:
    """Every tile config this GPU runs."""
    configs = TILE_CONFIGS if runs_wgmma() else tuple(c for c in TILE_CONFIGS if c not in WGMMA_CONFIGS)
    return tuple(c for c in configs if fits_shared_memory(c))


def _needs_config(config: str) -> None:
    if config in WGMMA_CONFIGS and not runs_wgmma():
        pytest.skip("the wgmma config runs only on compute capability 9.0 (H100/H200)")
    if config != "auto" and not fits_shared_memory(config):
        pytest.skip(f"config {config!r} needs more shared memory per block than this GPU allows")


def test_every_config_runs_on_an_h100_h200_and_small_everywhere() -> None:
    """The skips above cannot hide a config by mistake: on compute capability 9.0 every config
    fits, and `small` and `small-m32` (sm_120's) fit on every GPU the kernel supports."""
    assert fits_shared_memory("small") and fits_shared_memory("small-m32")
    if runs_wgmma():
        assert gpu_configs() == TILE_CONFIGS


def expected_small_shape(rows: int, keys: int, sms: int) -> str:
    """`auto`'s choice on a 99 KB part (prefer_small_m32 in kernel/csrc/verify_attention.cuh): the
    shape whose busiest SM costs less in row x key products, an M=32 row weighing 1.2 M=48 rows and
    M=48's fixed part 60 keys of a 48-row tile."""

    def work(m: int, row_cost: float) -> float:
        tiles = -(-rows // m)
        if tiles >= sms:
            return row_cost * m * keys * -(-tiles // sms)
        splits = max(1, min(sms // tiles, -(-keys // 64)))
        return row_cost * m * -(-keys // splits)

    return "small-m32" if work(32, 1.2) < work(48, 1.0) + 48 * 60 else "small"


def expected_wgmma_loop(rows: int, batch_size: int) -> str:
    """`auto`'s choice on an H100/H200 (wgmma_ws_pipelined in kernel/csrc/verify_attention_sm90.cuh):
    the pipelined loop from 256 rows (tokens x heads) a request on average."""
    return "wgmma-ws-pipe" if rows >= 256 * batch_size else "wgmma-ws"


def test_planned_config_names_what_each_call_runs() -> None:
    """kernel.planned_config resolves `config` as the call does: a forced config it can run is
    itself, one it cannot run raises, and `auto` is wgmma-ws or wgmma-ws-pipe on an H100/H200 or,
    on a 99 KB part, small-m32 or small by the rule of kernel/csrc/verify_attention.cuh
    (prefer_small_m32)."""
    import kernel

    device = torch.device("cuda")
    shapes = (
        ([1000], [16], 8),  # 128 rows a request: wgmma-ws
        ([40000], [16], 8),
        ([1000], [16], 2),
        ([1000], [16], 16),  # 256: wgmma-ws-pipe
        ([1000], [16], 64),
        ([1000, 3000], [16, 16], 8),  # 128 a request on average: wgmma-ws
        ([1000, 3000], [16, 15], 16),  # 248: wgmma-ws
        ([1000, 3000], [16, 17], 16),  # 264: wgmma-ws-pipe
    )
    for prefixes, drafts, heads in shapes:
        batch = make_batch(random.Random(0), device, prefixes, drafts, heads)
        args = (batch.q, batch.kv_indices, batch.qo_indptr)
        for config in TILE_CONFIGS:
            if config in gpu_configs():
                assert kernel.planned_config(*args, config) == config
            else:
                with pytest.raises(RuntimeError, match="cannot run"):
                    kernel.planned_config(*args, config)
        auto = kernel.planned_config(*args)
        rows = sum(drafts) * heads
        if runs_wgmma():
            assert auto == expected_wgmma_loop(rows, len(prefixes)), (prefixes, drafts, heads)
        elif fits_shared_memory("large"):
            assert auto == "large"
        else:
            keys, sms = (
                batch.kv_indices.numel(),
                torch.cuda.get_device_properties(device).multi_processor_count,
            )
            assert auto == expected_small_shape(rows, keys, sms), (prefixes, drafts, heads, sms)


@pytest.mark.parametrize("config", CONFIGS)
def test_fuzz_against_oracle(config: str) -> None:
    """160 random batches per config (tests/fuzz_env.py: more, or other draws, from the
    environment); 'auto' is wgmma-ws or wgmma-ws-pipe on an H100/H200 and mma.sync elsewhere,
    'small' and 'small-m32' are the sm_120 tile configs run here."""
    _needs_config(config)
    try:
        cases, offset = fuzz_settings()
    except ValueError as e:
        pytest.fail(str(e), pytrace=False)
    rng = random.Random(fuzz_seed(CONFIG_SEEDS[config], offset))
    device = torch.device("cuda")
    for i in range(cases):
        batch = random_batch(rng, device)
        out, lse = run_kernel(batch, config=config)
        assert_close(out, lse, batch, f"case {i} ({SEED_VAR}={offset}) {describe(batch)} config={config}")


@pytest.mark.parametrize("config", CONFIGS)
def test_output_is_bitwise_deterministic(config: str) -> None:
    """20 calls bitwise alike: a random batch (seed 7 draws a short single request) and a ragged
    one whose 200k prefix is split over every SM and merged by the combine."""
    _needs_config(config)
    device = torch.device("cuda")
    batches = [
        random_batch(random.Random(7), device),
        make_batch(random.Random(8), device, [200_000, 3000, 0], [64, 16, 1], 16),
    ]
    for batch in batches:
        first_out, first_lse = (t.clone() for t in run_kernel(batch, config=config))
        for i in range(20):
            out, lse = run_kernel(batch, validate=False, config=config)
            assert torch.equal(out.view(torch.int16), first_out.view(torch.int16)), (
                f"{describe(batch)} call {i}"
            )
            assert torch.equal(lse.view(torch.int32), first_lse.view(torch.int32)), (
                f"{describe(batch)} call {i}"
            )


# SM counts of other GPUs, whose plans (the prefix's splits, the grid) this GPU runs through
# `num_sms`: sm_120's RTX PRO 6000 (188, the target box) and RTX 5090 (170), a B200 (148), an RTX
# 5080 (84), one SM (no split at all) and the most the API takes (1024).
OTHER_SM_COUNTS = (188, 170, 148, 84, 1, 1024)
OTHER_SM_BATCHES = 8


@pytest.mark.parametrize("num_sms", OTHER_SM_COUNTS)
def test_plans_of_other_sm_counts(num_sms: int) -> None:
    """Every config, laid out for another GPU's SM count, passes against the oracle: a few random
    batches and P=32k H=8 T=16 (one request split over every SM), twice each, bitwise alike. More
    SMs than this GPU has runs in more than one wave, which the kernel must not mind."""
    rng = random.Random(3100 + num_sms)
    device = torch.device("cuda")
    batches = [make_batch(rng, device, [32768], [16], 8)]
    batches += [random_batch(rng, device) for _ in range(OTHER_SM_BATCHES)]
    for config in ("auto", *gpu_configs()):
        for i, batch in enumerate(batches):
            out, lse = (t.clone() for t in run_kernel(batch, config=config, num_sms=num_sms))
            label = f"batch {i} {describe(batch)} config={config} num_sms={num_sms}"
            assert_close(out, lse, batch, label)
            again, again_lse = run_kernel(batch, config=config, validate=False, num_sms=num_sms)
            assert torch.equal(out.view(torch.int16), again.view(torch.int16)), label
            assert torch.equal(lse.view(torch.int32), again_lse.view(torch.int32)), label


def test_num_sms_reaches_the_plan() -> None:
    """The control of the test above: `num_sms` is not dropped on the way to the kernel. One SM
    leaves P=32k H=8 T=16 unsplit (its rows written straight out), this GPU's own count splits it
    over every SM (fp16 partials merged by the combine): the two cannot agree to the bit on 64k
    outputs, while each passes the oracle."""
    batch = make_batch(random.Random(3200), torch.device("cuda"), [32768], [16], 8)
    for config in ("auto", *gpu_configs()):
        split, split_lse = (t.clone() for t in run_kernel(batch, config=config))
        whole, whole_lse = run_kernel(batch, config=config, num_sms=1)
        assert not torch.equal(split.view(torch.int16), whole.view(torch.int16)), config
        assert_close(split, split_lse, batch, f"{describe(batch)} config={config}")
        assert_close(whole, whole_lse, batch, f"{describe(batch)} num_sms=1 config={config}")


def test_the_binding_refuses_a_bad_num_sms() -> None:
    """The extension's own check, below the Python API's (tests/test_num_sms.py): a caller of the
    extension gets an error naming num_sms, not a plan for -1 SMs."""
    import kernel

    args = _good()
    ext = kernel.load_extension()
    for bad in (-1, kernel.MAX_NUM_SMS + 1):
        with pytest.raises(RuntimeError, match="num_sms must be 1 to 1024"):
            ext.verify_attention(*args.values(), None, None, True, 0, bad)
        with pytest.raises(RuntimeError, match="num_sms must be 1 to 1024"):
            ext.planned_config(
                0, 2, args["q"].shape[0], args["q"].shape[1], args["kv_indices"].numel(), 0, bad
            )


def test_long_prefix_split_is_deterministic_and_correct() -> None:
    """One 200k-prefix request: many splits through the combine step."""
    batch = make_batch(random.Random(11), torch.device("cuda"), [200000], [64], 16)
    out, lse = run_kernel(batch)
    assert_close(out, lse, batch, describe(batch))
    again, _ = run_kernel(batch, validate=False)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))


# Prefixes that put the first draft key at 0, 1, 16, 31, 47 and 48 keys into a KV tile (48 keys in
# wgmma-ws, 32 in the other configs) and one far into a long request; draft counts on both sides of
# one, two, three and eight 32-bit mask words.
MASK_EDGE_PREFIXES = (0, 1, 16, 31, 47, 48, 95, 4096 + 17, 32768 + 13)
MASK_EDGE_DRAFTS = (31, 32, 33, 64, 65, 97, 256)


@pytest.mark.parametrize("num_draft", MASK_EDGE_DRAFTS)
def test_draft_tiles_at_every_offset_and_mask_word(num_draft: int) -> None:
    """The masked tiles (those that reach the draft tokens) read the tree mask a word window at a
    time in wgmma-ws (kernel/NOTES.md, v33): the draft region starting anywhere in a tile, before
    or after a word boundary, in a request's only split or in the last of many, every config."""
    rng = random.Random(500 + num_draft)
    prefix = list(MASK_EDGE_PREFIXES)
    batch = make_batch(rng, torch.device("cuda"), prefix, [num_draft] * len(prefix), 2)
    for config in gpu_configs():
        out, lse = run_kernel(batch, config=config)
        assert_close(out, lse, batch, f"{describe(batch)} config={config}")


# (prefix, draft tokens, extra kv_indices past kv_indptr[1], extra tree_mask words past its
# indptr, extra q tokens past qo_indptr[1])
LONGER_THAN_INDPTR = (
    (70000, 16, 3000, 0, 0),
    (1000, 16, 60000, 5, 0),
    (100, 7, 0, 64, 5),
    (33000, 64, 48, 0, 0),
    (33000, 64, 0, 0, 3),
    # kv_indices past the lines the wgmma-ws kernels prefetch at entry (64 a CTA, ~270k slots on
    # 132 SMs): the rest is prefetched only up to kv_indptr[B], here nothing, then 928 lines
    (1000, 16, 400000, 0, 0),
    (300000, 16, 100000, 0, 0),
)


@pytest.mark.parametrize("case", LONGER_THAN_INDPTR, ids=lambda c: "P{}-T{}-kv+{}-mask+{}-q+{}".format(*c))
def test_one_request_whose_tensors_run_past_its_indptrs(case: tuple[int, int, int, int, int]) -> None:
    """An unvalidated call whose kv_indices, tree_mask or q is longer than its indptrs say
    (over-allocated buffers, as the SGLang adapter may pass) reads only what the indptrs address,
    and q's extra tokens (no request's) are not written. The extra slots point at finite rows, so
    a kernel that took a single request's bounds from the tensors' extents would attend to other
    keys, or misplace the draft tokens, and miss the oracle (kernel/NOTES.md, v37: caught for each
    case that extends kv_indices). A longer q in a split call faulted in the combine before its
    blocks past qo_indptr[-1] returned (`CombineRow::in_batch`)."""
    prefix, num_draft, extra_kv, extra_words, extra_q = case
    rng = random.Random(900 + prefix + extra_kv)
    batch = make_batch(rng, torch.device("cuda"), [prefix], [num_draft], 8)
    tail = torch.randint(0, batch.kv_cache.shape[0], (extra_kv,), device="cuda", dtype=torch.int32)
    finite = torch.isfinite(batch.kv_cache[tail.long()].float()).all(dim=-1)
    tail = torch.where(finite, tail, batch.kv_indices[0])  # slots of rows that hold values
    kv_indices = torch.cat([batch.kv_indices, tail])
    q = torch.cat([batch.q, torch.randn(extra_q, *batch.q.shape[1:], device="cuda").to(torch.bfloat16)])
    sentinel_out, sentinel_lse = -7.0, -9.0  # what rows no request owns must still hold after the call
    for config in gpu_configs():
        out = torch.full((q.shape[0], q.shape[1], 512), sentinel_out, dtype=torch.bfloat16, device="cuda")
        lse = torch.full(q.shape[:2], sentinel_lse, dtype=torch.float32, device="cuda")
        run_kernel(
            batch,
            config,
            validate=False,
            q=q,
            kv_indices=kv_indices,
            extra_mask_words=extra_words,
            out=out,
            lse=lse,
        )
        torch.cuda.synchronize()  # a fault shows here, in this test
        assert_close(out[:num_draft], lse[:num_draft], batch, f"{describe(batch)} {case} config={config}")
        assert (out[num_draft:] == sentinel_out).all() and (lse[num_draft:] == sentinel_lse).all(), (
            f"{describe(batch)} {case} config={config}: rows past qo_indptr[-1] were written"
        )


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the empty batch launches nothing
def test_an_empty_batch_writes_nothing_on_every_config() -> None:
    """B = 0 (qo_indptr = [0]). Validated, q must then hold no token (qo_indptr[-1] = 0 =
    q.size(0)) and every config runs the call; a q with tokens that no request owns is refused by
    name. Unvalidated (the CUDA-graph path), such tokens are left alone: given outputs untouched,
    eagerly and in a CUDA graph."""
    import kernel

    cuda = torch.device("cuda")
    q = torch.randn(3, 8, 576, device=cuda).to(torch.bfloat16)
    kv = torch.randn(5, 576, device=cuda).to(torch.bfloat16)
    zero = torch.zeros(1, dtype=torch.int32, device=cuda)
    no_words = torch.zeros(0, dtype=torch.int32, device=cuda)
    no_slots = torch.zeros(0, dtype=torch.int32, device=cuda)
    for config in ("auto", *gpu_configs()):
        empty_out, empty_lse = kernel.verify_attention(
            q[:0], kv, no_slots, zero, zero, no_words, zero, 0.1, config=config
        )
        assert empty_out.shape == (0, 8, 512) and empty_lse.shape == (0, 8), config
        with pytest.raises(RuntimeError, match=r"qo_indptr\[-1\] = 0 must equal q.size\(0\) = 3"):
            kernel.verify_attention(q, kv, no_slots, zero, zero, no_words, zero, 0.1, config=config)
        out = torch.full((3, 8, 512), -7.0, dtype=torch.bfloat16, device=cuda)
        lse = torch.full((3, 8), -9.0, dtype=torch.float32, device=cuda)
        got = kernel.verify_attention(
            q, kv, no_slots, zero, zero, no_words, zero, 0.1, out=out, lse=lse, validate=False, config=config
        )
        torch.cuda.synchronize()
        assert got[0] is out and got[1] is lse
        assert (out == -7.0).all() and (lse == -9.0).all(), f"config={config}: an empty batch wrote rows"
        fresh_out, fresh_lse = kernel.verify_attention(
            q, kv, no_slots, zero, zero, no_words, zero, 0.1, validate=False, config=config
        )
        assert fresh_out.shape == (3, 8, 512) and fresh_lse.shape == (3, 8), config
    out = torch.full((3, 8, 512), -7.0, dtype=torch.bfloat16, device=cuda)
    replay = capture_graph(
        lambda: kernel.verify_attention(
            q, kv, no_slots, zero, zero, no_words, zero, 0.1, out=out, validate=False
        ),
        cuda,
        warmup=1,
    )
    replay()
    torch.cuda.synchronize()
    assert (out == -7.0).all()


def test_without_a_q_tensor_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the driver has no tensor-map encoder the wgmma-ws kernels stage Q without bulk tensor
    copies (`wgmma-ws-pipe` by cp.async into the same layout, `wgmma-ws` by its direct fragment
    loads; kernel/NOTES.md v67, v69). VERIFY_ATTN_NO_Q_TENSOR_MAP forces that path: single
    requests of 128 and 256+ rows and a ragged batch, every config, against the oracle."""
    monkeypatch.setenv("VERIFY_ATTN_NO_Q_TENSOR_MAP", "1")
    rng = random.Random(77)
    batches = [
        make_batch(rng, torch.device("cuda"), [5000], [16], 8),
        make_batch(rng, torch.device("cuda"), [7000], [16], 32),
        make_batch(rng, torch.device("cuda"), [3000, 40, 900], [16, 5, 32], 16),
    ]
    for batch in batches:
        for config in gpu_configs():
            out, lse = run_kernel(batch, config=config)
            assert_close(out, lse, batch, f"{describe(batch)} no q tensor map config={config}")


@pytest.mark.parametrize("b", [32, 33, 48])
def test_batches_around_the_one_warp_plan(b: int) -> None:
    """Up to 32 requests the plan is computed by one warp, above by the whole block (two code
    paths, one answer): ragged batches on both sides of the boundary, some requests long enough
    to be split, every config the GPU runs."""
    rng = random.Random(100 + b)
    prefix = [rng.choice((0, 7, 900, 4000, 33000)) for _ in range(b)]
    num_draft = [rng.choice((1, 3, 16)) for _ in range(b)]
    batch = make_batch(rng, torch.device("cuda"), prefix, num_draft, 8)
    for config in gpu_configs():
        out, lse = run_kernel(batch, config=config)
        assert_close(out, lse, batch, f"{describe(batch)} config={config}")


def test_growing_scores_move_the_reference_max() -> None:
    """KV rows scaled up along the prefix, so each row's max passes the reference by more than the
    rescale threshold many times (the wgmma-ws kernel rescales O only then) and also grows by less
    in between (P up to 2^8 before a move): results still match the oracle."""
    rng = random.Random(21)
    batch = make_batch(rng, torch.device("cuda"), [6000, 300], [4, 16], 16)
    for b in range(2):
        lo, hi = int(batch.kv_indptr[b]), int(batch.kv_indptr[b + 1])
        ramp = torch.linspace(0.05, 6.0, hi - lo, device="cuda") ** (1.5 if b == 0 else 1.0)
        slots = batch.kv_indices[lo:hi].long()
        batch.kv_cache[slots] = (batch.kv_cache[slots].float() * ramp[:, None]).to(torch.bfloat16)
    for config in gpu_configs():
        out, lse = run_kernel(batch, config=config)
        assert_close(out, lse, batch, f"{describe(batch)} config={config}")


@pytest.mark.parametrize("exponent", [100, -100])
def test_values_far_from_one(exponent: int) -> None:
    """KV rows times 2^e and q times 2^-e (exact in bf16): the scores are unchanged and the output
    is 2^e times larger, so split partials far from 1 (the wgmma-ws config stores them as fp16
    over a per-row power of two) must still come out right."""
    rng = random.Random(31)
    batch = make_batch(rng, torch.device("cuda"), [40000, 50], [16, 3], 8)
    slots = batch.kv_indices.long()
    batch.kv_cache[slots] = (batch.kv_cache[slots].float() * 2.0**exponent).to(torch.bfloat16)
    batch.q.copy_((batch.q.float() * 2.0**-exponent).to(torch.bfloat16))
    for config in gpu_configs():
        out, lse = run_kernel(batch, config=config)
        assert_close(out, lse, batch, f"{describe(batch)} x2^{exponent} config={config}")


@pytest.mark.parametrize("config", CONFIGS)
def test_cuda_graph_replay_equals_eager(config: str) -> None:
    """Capture (the combine a programmatic dependent launch on cc >= 9.0) and replay, per config."""
    import kernel

    _needs_config(config)
    batch = random_batch(random.Random(3), torch.device("cuda"))
    mask, mask_indptr = (t.cuda() for t in kernel.pack_parents(batch.parents))
    args = (batch.q, batch.kv_cache, batch.kv_indices, batch.qo_indptr, batch.kv_indptr, mask, mask_indptr)
    eager_out, eager_lse = kernel.verify_attention(*args, batch.sm_scale, config=config)
    out = torch.empty_like(eager_out)
    lse = torch.empty_like(eager_lse)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernel.verify_attention(*args, batch.sm_scale, out=out, lse=lse, validate=False, config=config)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.verify_attention(*args, batch.sm_scale, out=out, lse=lse, validate=True, config=config)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))  # both outputs: the warm-up call above left eager's values in them
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager_out.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), eager_lse.view(torch.int32))
    # A replay reads its inputs as they are then: new q values in the captured buffer give what an
    # eager call on them gives, not the captured call's result again.
    batch.q.copy_(torch.randn(batch.q.shape, device="cuda").to(torch.bfloat16))
    new_out, new_lse = kernel.verify_attention(*args, batch.sm_scale, config=config)
    assert not torch.equal(new_out, eager_out), (
        "new q values gave the old output: the check below shows nothing"
    )
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), new_out.view(torch.int16)), "the replay did not read q anew"
    assert torch.equal(lse.view(torch.int32), new_lse.view(torch.int32))


@functools.cache
def _late_writer():
    """A Triton kernel that lets the next kernel in the stream launch at its start (a programmatic
    dependent launch trigger), spins ``spin_us`` on the global timer, then copies ``src`` into
    ``dst``: a kernel after it that reads ``dst`` before its griddepcontrol.wait reads what was
    there before (without the wait, our main kernel reads q's NaN here; kernel/NOTES.md, v38)."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    try:
        from triton.language.extra.cuda import gdc_launch_dependents
    except ImportError:
        pytest.skip(f"triton {triton.__version__} has no gdc_launch_dependents")

    @triton.jit
    def now_ns():
        return tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )

    @triton.jit
    def late_copy(src, dst, n, spin_ns, BLOCK: tl.constexpr):
        gdc_launch_dependents()
        t0 = now_ns()
        while now_ns() - t0 < spin_ns:
            pass
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    def write(src: torch.Tensor, dst: torch.Tensor, spin_us: int = 200) -> None:
        late_copy[(1,)](src, dst, src.numel(), spin_us * 1000, BLOCK=1024)

    return write


@pytest.mark.parametrize("config", CONFIGS)
def test_inputs_written_by_the_kernel_just_before(config: str) -> None:
    """The main kernel launches as a programmatic dependent of the kernel before it (cc >= 9.0):
    q written by a kernel that allows its dependents to launch at its start and writes q 200 us
    later must be read as written, eagerly and in a captured graph (q holds NaN until then)."""
    import kernel

    _needs_config(config)
    write = _late_writer()
    batch = make_batch(random.Random(5), torch.device("cuda"), [3000, 70000], [9, 16], 8)
    mask, mask_indptr = (t.cuda() for t in kernel.pack_parents(batch.parents))
    q = torch.full_like(batch.q, float("nan"))
    args = (q, batch.kv_cache, batch.kv_indices, batch.qo_indptr, batch.kv_indptr, mask, mask_indptr)
    ref_out, ref_lse = kernel.verify_attention(batch.q, *args[1:], batch.sm_scale, config=config)
    write(batch.q, q)
    out, lse = kernel.verify_attention(*args, batch.sm_scale, validate=False, config=config)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), "eager: q read before it was written"

    out = torch.empty_like(ref_out)
    lse = torch.empty_like(ref_lse)

    def step() -> None:
        write(batch.q, q)
        kernel.verify_attention(*args, batch.sm_scale, out=out, lse=lse, validate=False, config=config)

    replay = capture_graph(step, torch.device("cuda"), warmup=1)
    q.fill_(float("nan"))
    out.fill_(float("nan"))
    lse.fill_(float("nan"))  # the warm-up wrote both outputs
    replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), "graph: q read before it was written"


# ---------------------------------------------------------------------------------------------
# Bad input: each error names the argument.
# ---------------------------------------------------------------------------------------------
def _good():
    import kernel

    batch = make_batch(random.Random(5), torch.device("cuda"), [300, 1000], [5, 16], 4)
    mask, mask_indptr = (t.cuda() for t in kernel.pack_parents(batch.parents))
    return {
        "q": batch.q,
        "kv_cache": batch.kv_cache,
        "kv_indices": batch.kv_indices,
        "qo_indptr": batch.qo_indptr,
        "kv_indptr": batch.kv_indptr,
        "tree_mask": mask,
        "tree_mask_indptr": mask_indptr,
        "sm_scale": batch.sm_scale,
    }


def _swap(args: dict, **changes) -> dict:
    return {**args, **changes}


def _inside(t: torch.Tensor, a: dict) -> torch.Tensor:
    """An out of the right shape, dtype and alignment carved from the start of ``t``'s memory."""
    n, h = a["q"].shape[:2]
    return t.view(-1)[: n * h * 512].view(n, h, 512)


def _set(t: torch.Tensor, index: int, value: int) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


BAD_CASES = {
    "q dtype": (lambda a: _swap(a, q=a["q"].float()), "q must be BFloat16, got Float"),
    "q on cpu": (lambda a: _swap(a, q=a["q"].cpu()), "q must be a CUDA tensor"),
    "q head dim": (
        lambda a: _swap(a, q=a["q"][..., :512].contiguous()),
        "q must be [num_tokens, num_heads, 576]",
    ),
    "q not contiguous": (
        lambda a: _swap(a, q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)),
        "q must be contiguous",
    ),
    "kv_cache dtype": (
        lambda a: _swap(a, kv_cache=a["kv_cache"].half()),
        "kv_cache must be BFloat16, got Half",
    ),
    "kv_cache dims": (
        lambda a: _swap(a, kv_cache=a["kv_cache"][:, :512].contiguous()),
        "kv_cache must be [num_slots, 576] or [num_slots, 1, 576]",
    ),
    "kv_cache on another device": (lambda a: _swap(a, kv_cache=a["kv_cache"].cpu()), "kv_cache must be on"),
    "kv_indices int64": (
        lambda a: _swap(a, kv_indices=a["kv_indices"].long()),
        "kv_indices must be Int, got Long",
    ),
    "qo_indptr length": (
        lambda a: _swap(a, qo_indptr=a["qo_indptr"][:-1].contiguous()),
        "kv_indptr must be [B+1] = [2] like qo_indptr",
    ),
    "kv_indptr length": (
        lambda a: _swap(a, kv_indptr=a["kv_indptr"][:-1].contiguous()),
        "kv_indptr must be [B+1]",
    ),
    "kv_indptr not monotonic": (
        lambda a: _swap(a, kv_indptr=_set(a["kv_indptr"], 1, int(a["kv_indptr"][2]) + 1)),
        "kv_indptr must be non-decreasing",
    ),
    "request without draft tokens": (
        lambda a: _swap(a, qo_indptr=_set(a["qo_indptr"], 1, 0)),
        "request 0 has no draft token",
    ),
    "slot outside the pool": (
        lambda a: _swap(
            a,
            kv_indices=torch.where(
                torch.arange(a["kv_indices"].numel(), device="cuda") == 3,
                a["kv_cache"].shape[0],
                a["kv_indices"],
            ).int(),
        ),
        "kv_indices[3]",
    ),
    "negative slot": (
        lambda a: _swap(a, kv_indices=(a["kv_indices"] * 0 - 1).int()),
        "is outside the pool",
    ),
    "tree mask without diagonal": (
        lambda a: _swap(a, tree_mask=torch.zeros_like(a["tree_mask"])),
        "tree_mask: draft token 0 of request 0 does not see itself",
    ),
    "tree_mask_indptr inconsistent": (
        lambda a: _swap(a, tree_mask_indptr=(a["tree_mask_indptr"] * 2).int()),
        "must equal tree_mask.numel()",
    ),
    "q misaligned": (
        lambda a: _swap(
            a, q=torch.empty(a["q"].numel() + 1, dtype=torch.bfloat16, device="cuda")[1:].view(a["q"].shape)
        ),
        "q must start at a 16-byte aligned address",
    ),
    "out misaligned": (
        lambda a: _swap(
            a,
            out=torch.empty(a["q"].shape[0] * a["q"].shape[1] * 512 + 1, dtype=torch.bfloat16, device="cuda")[
                1:
            ].view(a["q"].shape[0], a["q"].shape[1], 512),
        ),
        "out must start at a 16-byte aligned address",
    ),
    "sm_scale nan": (
        lambda a: _swap(a, sm_scale=float("nan")),
        "sm_scale must be a finite positive number, got nan",
    ),
    "sm_scale negative": (
        lambda a: _swap(a, sm_scale=-0.1),
        "sm_scale must be a finite positive number, got -0.1",
    ),
    # Finite and positive as a double, but 0 or inf in the float32 the kernel computes in.
    "sm_scale below float32": (lambda a: _swap(a, sm_scale=1e-50), "outside float32's normal range"),
    "sm_scale above float32": (lambda a: _swap(a, sm_scale=3e38), "outside float32's normal range"),
    "kv_cache misaligned": (
        lambda a: _swap(
            a,
            kv_cache=torch.empty(a["kv_cache"].numel() + 8, dtype=torch.bfloat16, device="cuda")[1:][
                : a["kv_cache"].numel()
            ].view(a["kv_cache"].shape),
        ),
        "kv_cache must start at a 16-byte aligned address",
    ),
    "kv_cache with two heads": (
        lambda a: _swap(a, kv_cache=torch.zeros(64, 2, 576, dtype=torch.bfloat16, device="cuda")),
        "kv_cache must be [num_slots, 576] or [num_slots, 1, 576]",
    ),
    "q without heads": (
        lambda a: _swap(a, q=torch.empty(a["q"].shape[0], 0, 576, dtype=torch.bfloat16, device="cuda")),
        "q must have at least one head",
    ),
    "more requests than tokens": (
        lambda a: _swap(a, q=a["q"][:1].contiguous()),
        "but qo_indptr has 2 requests",
    ),
    "qo_indptr not from 0": (
        lambda a: _swap(a, qo_indptr=_set(a["qo_indptr"], 0, 1)),
        "qo_indptr[0] must be 0",
    ),
    "qo_indptr short of q": (
        lambda a: _swap(a, qo_indptr=_set(a["qo_indptr"], -1, a["q"].shape[0] - 1)),
        "must equal q.size(0)",
    ),
    "fewer slots than draft tokens": (
        lambda a: _swap(a, kv_indptr=_set(a["kv_indptr"], 1, 3)),
        "request 0 has 3 KV slots (kv_indptr) but 5 draft tokens",
    ),
    "tree_mask_indptr not from 0": (
        lambda a: _swap(a, tree_mask_indptr=_set(a["tree_mask_indptr"], 0, 1)),
        "tree_mask_indptr[0] must be 0",
    ),
    "kv_indices beyond 2^30 - 64": (
        # at 2^30 the 48-key tiles' plan wrapped int32 and every row read NaN (binding.cpp kMaxKeys)
        lambda a: _swap(a, kv_indices=torch.zeros(2**30 - 63, dtype=torch.int32, device="cuda")),
        "kv_indices has 1073741761 entries; at most 1073741760 (2^30 - 64)",
    ),
    "heads beyond 2^30 with no tokens": (
        # N * H = 0 bounds nothing; the plan took H as an int (0) and divided by it on sm_120
        lambda a: _swap(
            a,
            q=torch.empty(0, 2**31, 576, dtype=torch.bfloat16, device="cuda"),
            qo_indptr=torch.zeros(1, dtype=torch.int32, device="cuda"),
            kv_indptr=torch.zeros(1, dtype=torch.int32, device="cuda"),
            tree_mask_indptr=torch.zeros(1, dtype=torch.int32, device="cuda"),
        ),
        "and q.size(1) = 2147483648 must each be at most 1073741824 (2^30)",
    ),
    "out shape": (
        lambda a: _swap(a, out=torch.empty(*a["q"].shape[:2], 576, dtype=torch.bfloat16, device="cuda")),
        "out must be [",
    ),
    "out on cpu": (
        lambda a: _swap(a, out=torch.empty(*a["q"].shape[:2], 512, dtype=torch.bfloat16)),
        "out must be on",
    ),
    "lse dtype": (
        lambda a: _swap(a, lse=torch.empty(*a["q"].shape[:2], dtype=torch.bfloat16, device="cuda")),
        "lse must be Float",
    ),
    "out inside q": (lambda a: _swap(a, out=_inside(a["q"], a)), "out must not share memory with q"),
    "out inside kv_cache": (
        lambda a: _swap(a, out=_inside(a["kv_cache"], a)),
        "out must not share memory with kv_cache",
    ),
    "lse inside out": (
        lambda a: _swap(
            a,
            out=(o := torch.empty(*a["q"].shape[:2], 512, dtype=torch.bfloat16, device="cuda")),
            lse=o.view(-1)[: 2 * a["q"].shape[0] * a["q"].shape[1]]
            .view(torch.float32)
            .view(*a["q"].shape[:2]),
        ),
        "lse must not share memory with out",
    ),
    "sm_scale tensor": (
        lambda a: _swap(a, sm_scale=torch.tensor(0.1, device="cuda")),
        "sm_scale must be a Python number",
    ),
    "num_sms zero": (lambda a: _swap(a, num_sms=0), "num_sms must be None or an int from 1 to 1024"),
    "num_sms beyond any GPU": (
        lambda a: _swap(a, num_sms=5000),
        "num_sms must be None or an int from 1 to 1024",
    ),
}


def raise_bad_input(case: str) -> str:
    """The error message the kernel raises for one BAD_CASES entry ("" when nothing is raised)."""
    import kernel

    mutate, _ = BAD_CASES[case]
    try:
        kernel.verify_attention(**mutate(_good()))
    except (RuntimeError, ValueError, TypeError) as e:
        return str(e)
    return ""


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_names_the_argument(case: str) -> None:
    """Each case runs in its own process: a crash must fail the case it belongs to, not end the
    session, and the expected words must appear in the error."""
    code = f"import sys; sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1])]!r}; "
    code += f"from test_kernel_gpu import raise_bad_input; print(raise_bad_input({case!r}))"
    res = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, f"{case}: the process died (exit {res.returncode}):\n{res.stderr[-3000:]}"
    expected = BAD_CASES[case][1]
    assert expected in res.stdout, f"{case}: error does not name {expected!r}: {res.stdout[-2000:]!r}"


def test_bad_config_name_is_refused() -> None:
    import kernel

    with pytest.raises(ValueError, match="config must be one of"):
        kernel.verify_attention(**_good(), config="huge")


@pytest.mark.parametrize("config", TILE_CONFIGS)
@pytest.mark.parametrize("name", ["smoke", "ddtree", "ragged", "kimi-k2-tp8", "two-long", "deepseek-v3-200k"])
def test_parity_on_bundle(name: str, config: str) -> None:
    """Numeric and token-exact parity on every canonical bundle, in every tile config."""
    _needs_config(config)
    from harness import bundles, parity
    from harness.impl_kernel import NAME, prepare

    bundle = bundles.load(name)
    batch = bundles.to_batch(bundle, "cuda")
    out, lse = prepare(batch, config=config)()
    row = parity.check(bundle, NAME, out, lse)
    assert row.status == "pass", f"{name} ({config}): {row.reason}"
    assert row.tokens_match and row.path_match
