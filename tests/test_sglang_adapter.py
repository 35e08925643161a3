"""kernel/sglang_adapter.py: SGLang's verify arguments converted for this kernel, and the drop-in.

The conversion (torch ops; on a GPU the slot list by a Triton kernel, run here in Triton's
interpreter) is checked on the CPU against kernel.tree_mask.pack_parents and the batch's own
kv_indices. SGLang's arguments come from harness.impl_sglang.sglang_verify_args,
the same conversion the baseline uses, so these tests also tie the baseline's inputs to ours.
The GPU tests run both kernels on the same SGLang-format batches.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.impl_sglang import SglangVerifyArgs, sglang_verify_args
from harness.tree import chain, custom_mask_from_parents, random_tree
from kernel import sglang_adapter
from kernel.sglang_adapter import check_sglang_metadata, extend_attention_fwd, verify_metadata_from_sglang
from kernel.tree_mask import pack_parents, pack_visibility, words_per_row

REL_TOL, COS_TOL = 1e-2, 0.9999
SM_SCALE = 1 / math.sqrt(192)
DRAFT_SIZES = (1, 4, 16, 64)
# (heads, largest prefix) for the GPU cases: the float64 reference's rows x keys stay <= ~6e7.
GPU_SHAPES = ((1, 70000), (8, 5000), (16, 5000), (64, 300))


def random_batch(
    rng: random.Random,
    *,
    num_heads: int = 1,
    max_prefix: int = 300,
    draft_sizes: tuple[int, ...] = DRAFT_SIZES,
    same_draft_size: bool = False,
    device: torch.device | str = "cpu",
) -> VerifyBatch:
    """Up to 8 requests, ragged prefixes (0 included), random trees and chains; slots shuffled over
    a pool larger than needed whose unreferenced rows hold NaN."""
    b = rng.randint(1, 8)
    prefix = [rng.choice((0, 1, rng.randint(0, max_prefix))) for _ in range(b)]
    sizes = [rng.choice(draft_sizes)] * b if same_draft_size else [rng.choice(draft_sizes) for _ in range(b)]
    parents = tuple(chain(t) if rng.random() < 0.25 else random_tree(t, rng.randrange(2**31)) for t in sizes)
    kv_lens = [p + t for p, t in zip(prefix, sizes, strict=True)]
    total = sum(kv_lens)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    pool = torch.full((total + rng.randint(1, 64), QK_DIM), float("nan"))
    slots = torch.randperm(pool.shape[0], generator=g)[:total]
    pool[slots] = torch.randn(total, QK_DIM, generator=g)
    q = torch.randn(sum(sizes), num_heads, QK_DIM, generator=g)
    batch = VerifyBatch(
        q=q.to(torch.bfloat16),
        kv_cache=pool.to(torch.bfloat16),
        kv_indices=slots.to(torch.int32),
        qo_indptr=torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32),
        kv_indptr=torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32),
        prefix_lens=tuple(prefix),
        parents=parents,
        sm_scale=SM_SCALE,
    )
    return batch.to(device)


def convert(args: SglangVerifyArgs, **overrides: object):
    kwargs = {
        "qo_indptr": args.qo_indptr,
        "kv_indptr": args.kv_indptr,
        "kv_indices": args.kv_indices,
        "out_cache_loc": args.out_cache_loc,
        "custom_mask": args.custom_mask,
        "mask_indptr": args.mask_indptr,
        "max_len_extend": args.max_len_extend,
    }
    kwargs.update(overrides)
    return verify_metadata_from_sglang(**kwargs)


def assert_tree_mask_equals(got, tree_mask: torch.Tensor, tree_mask_indptr: torch.Tensor) -> None:
    """The addressed words equal; a tail past the last indptr entry (sized from host ints) is zero."""
    assert torch.equal(got.tree_mask_indptr, tree_mask_indptr)
    end = int(tree_mask_indptr[-1])
    assert torch.equal(got.tree_mask[:end], tree_mask)
    assert not got.tree_mask[end:].any()


@pytest.mark.parametrize("seed", range(40))
def test_conversion_matches_our_kv_indices_and_pack_parents(seed: int) -> None:
    batch = random_batch(random.Random(seed), same_draft_size=seed % 2 == 0)
    got = convert(sglang_verify_args(batch), prefix_len_sum=sum(batch.prefix_lens))
    assert torch.equal(got.kv_indices, batch.kv_indices)
    assert torch.equal(got.kv_indptr, batch.kv_indptr)
    tree_mask, tree_mask_indptr = pack_parents(batch.parents)
    assert_tree_mask_equals(got, tree_mask, tree_mask_indptr)
    if len(set(batch.num_draft)) == 1:
        # SGLang verifies the same number of draft tokens per request: then sizes are exact.
        assert got.tree_mask.numel() == int(tree_mask_indptr[-1])


def test_mixed_words_per_row_is_packed_per_request() -> None:
    parents = (random_tree(64, 1), chain(5), random_tree(33, 2), chain(1))
    sizes = [len(p) for p in parents]
    prefix = (3, 0, 41, 1)
    kv_lens = [p + t for p, t in zip(prefix, sizes, strict=True)]
    batch = VerifyBatch(
        q=torch.zeros(sum(sizes), 1, QK_DIM, dtype=torch.bfloat16),
        kv_cache=torch.zeros(sum(kv_lens), QK_DIM, dtype=torch.bfloat16),
        kv_indices=torch.randperm(sum(kv_lens), generator=torch.Generator().manual_seed(3)).to(torch.int32),
        qo_indptr=torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32),
        kv_indptr=torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32),
        prefix_lens=prefix,
        parents=parents,
        sm_scale=SM_SCALE,
    )
    got = convert(sglang_verify_args(batch), prefix_len_sum=sum(prefix))
    tree_mask, tree_mask_indptr = pack_parents(parents)
    assert_tree_mask_equals(got, tree_mask, tree_mask_indptr)
    assert torch.equal(got.kv_indices, batch.kv_indices)


def test_overallocated_sglang_kv_indices_leave_a_zero_tail() -> None:
    batch = random_batch(random.Random(11))
    args = sglang_verify_args(batch)
    spare = torch.full((37,), 123456, dtype=torch.int64)
    got = convert(args, kv_indices=torch.cat([args.kv_indices, spare]))
    end = int(batch.kv_indptr[-1])
    assert got.kv_indices.numel() == args.kv_indices.numel() + spare.numel() + batch.q.shape[0]
    assert torch.equal(got.kv_indices[:end], batch.kv_indices)
    assert not got.kv_indices[end:].any()


@pytest.mark.parametrize("is_causal", [True, False])
def test_without_custom_mask_causal_gives_a_chain_else_full_visibility(is_causal: bool) -> None:
    batch = random_batch(random.Random(5), draft_sizes=(4, 16, 64))
    got = convert(sglang_verify_args(batch), custom_mask=None, mask_indptr=None, is_causal=is_causal)
    if is_causal:
        expected = pack_parents([chain(t) for t in batch.num_draft])
    else:
        expected = pack_visibility([torch.ones(t, t, dtype=torch.bool) for t in batch.num_draft])
    assert_tree_mask_equals(got, *expected)


def test_causal_hides_later_draft_tokens_a_custom_mask_shows() -> None:
    batch = random_batch(random.Random(9), draft_sizes=(16,))
    args = sglang_verify_args(batch)
    all_visible = torch.ones_like(args.custom_mask)
    causal = convert(args, custom_mask=all_visible, is_causal=True)
    full = convert(args, custom_mask=all_visible, is_causal=False)
    assert_tree_mask_equals(causal, *pack_parents([chain(t) for t in batch.num_draft]))
    assert not torch.equal(causal.tree_mask, full.tree_mask)


def test_conversion_reads_no_tensor_data() -> None:
    # On the meta device any .item(), host copy or data-dependent shape raises: passing here
    # means the conversion only launches device work, as CUDA-graph capture requires.
    args = sglang_verify_args(random_batch(random.Random(3)))
    meta = {
        name: getattr(args, name).to("meta")
        for name in ("qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "custom_mask", "mask_indptr")
    }
    got = verify_metadata_from_sglang(**meta, max_len_extend=args.max_len_extend, prefix_len_sum=17)
    assert got.kv_indices.shape == (17 + args.out_cache_loc.numel(),)


def test_unsupported_sglang_options_are_refused_by_name() -> None:
    args = sglang_verify_args(random_batch(random.Random(2)))
    o = torch.empty(args.q_extend.shape[0], args.q_extend.shape[1], V_DIM, dtype=torch.bfloat16)
    positional = list(args.kernel_kwargs(o).values())
    with pytest.raises(ValueError, match="sliding_window_size"):
        extend_attention_fwd(*positional, out_cache_loc=args.out_cache_loc, sliding_window_size=128)
    with pytest.raises(ValueError, match="skip_prefix_custom_mask = False"):
        extend_attention_fwd(*positional, out_cache_loc=args.out_cache_loc, skip_prefix_custom_mask=False)
    with pytest.raises(ValueError, match="k_scale"):
        extend_attention_fwd(*positional[:13], 0.5, 1.0, args.sm_scale, out_cache_loc=args.out_cache_loc)
    with pytest.raises(ValueError, match="v_buffer"):
        extend_attention_fwd(
            *positional[:5], args.v_extend, *positional[6:], out_cache_loc=args.out_cache_loc
        )


def test_a_prefix_len_sum_beyond_kv_indices_is_refused_by_name() -> None:
    args = sglang_verify_args(random_batch(random.Random(4)))
    for bad in (-1, args.kv_indices.numel() + 1):
        with pytest.raises(ValueError, match="prefix_len_sum"):
            convert(args, prefix_len_sum=bad)


def test_an_empty_batch_converts_to_empty_metadata() -> None:
    empty = torch.zeros(1, dtype=torch.int32)
    got = verify_metadata_from_sglang(
        empty, empty, torch.zeros(5, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), None, None, 1
    )
    assert got.kv_indptr.tolist() == [0] and got.tree_mask_indptr.tolist() == [0]
    assert got.tree_mask.numel() == 0 and not got.kv_indices.any()


def test_max_len_extend_below_a_request_never_writes_out_of_bounds() -> None:
    """A broken precondition (SGLang's own): the conversion still stays inside its buffers (on a GPU
    an out-of-bounds scatter is a device assert that ends the process), and validate names it."""
    batch = random_batch(random.Random(6), draft_sizes=(33,))
    args = sglang_verify_args(batch)
    got = convert(args, max_len_extend=32)
    assert got.tree_mask.numel() == batch.q.shape[0] * words_per_row(32)
    with pytest.raises(ValueError, match="max_len_extend = 32, but request 0 has 33 draft tokens"):
        check_sglang_metadata(args.qo_indptr, args.kv_indptr, args.kv_indices, 32)


def test_check_sglang_metadata_names_each_broken_precondition() -> None:
    args = sglang_verify_args(random_batch(random.Random(8)))
    ok = (args.qo_indptr, args.kv_indptr, args.kv_indices, args.max_len_extend)
    check_sglang_metadata(*ok)
    check_sglang_metadata(*ok, prefix_len_sum=int(args.kv_indptr[-1]) + 5)  # a bound above the sum
    with pytest.raises(ValueError, match="kv_indices has 0 slots but kv_indptr addresses"):
        check_sglang_metadata(args.qo_indptr, args.kv_indptr, args.kv_indices[:0], args.max_len_extend)
    if int(args.kv_indptr[-1]) > 0:
        with pytest.raises(ValueError, match="prefix_len_sum = 0 but kv_indptr addresses"):
            check_sglang_metadata(*ok, prefix_len_sum=0)
    with pytest.raises(ValueError, match="qo_indptr must start at 0 and never decrease"):
        check_sglang_metadata(args.qo_indptr.flip(0), *ok[1:])
    with pytest.raises(ValueError, match=r"qo_indptr and kv_indptr must both be \[B\+1\]"):
        check_sglang_metadata(args.qo_indptr, args.kv_indptr[:-1], *ok[2:])


def test_check_sglang_metadata_names_a_mask_indptr_that_moves_a_block() -> None:
    """A mask_indptr off SGLang's layout hands the conversion another block of bytes: with a tree
    whose diagonal survives the shift, nothing downstream can tell (the kernel's validation reads
    only the diagonal), so the adapter's own validation must name it."""
    parents, prefix = (-1, 0, 0, 1), 3
    mask, mask_indptr = custom_mask_from_parents([parents], [prefix])
    stale = custom_mask_from_parents([(-1, 0, 1, 2)], [prefix])[0]  # an earlier step's chain
    buffer = torch.cat([mask, stale])  # over-allocated, as SGLang's graph buffers are
    qo, kvp = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, prefix], dtype=torch.int32)
    kv_indices, out_cache_loc = torch.arange(prefix), torch.arange(100, 104)
    moved = mask_indptr + mask.numel()  # the stale chain's block instead
    got = verify_metadata_from_sglang(qo, kvp, kv_indices, out_cache_loc, buffer, moved, 4)
    wrong, right = got.tree_mask.tolist(), pack_parents([parents])[0].tolist()
    assert wrong != right and all(w >> i & 1 for i, w in enumerate(wrong))  # diagonal intact
    check_sglang_metadata(qo, kvp, kv_indices, 4, custom_mask=buffer, mask_indptr=mask_indptr)
    for bad, message in (
        (moved, r"mask_indptr\[0\] = 28; expected 0"),
        (torch.tensor([4, 32]), r"mask_indptr\[0\] = 4; expected 0"),
        (
            torch.tensor([0, 27]),
            r"mask_indptr\[1\] - mask_indptr\[0\] = 27, expected request 0's T \* \(P \+ T\) = 4 \* \(3 \+ 4\) = 28",
        ),
        (torch.tensor([0, 28]), r"mask_indptr\[-1\] = 28 is past the end of custom_mask \(27 entries\)"),
        (torch.tensor([0]), r"mask_indptr must be \[B\+1\] = \(2,\) with a custom_mask, got \(1,\)"),
    ):
        short = buffer[:27] if "past the end" in message else buffer
        with pytest.raises(ValueError, match=message):
            check_sglang_metadata(qo, kvp, kv_indices, 4, custom_mask=short, mask_indptr=bad)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("qo_indptr", [0, 1], "qo_indptr must be a 1-D int32 or int64 tensor, got list"),
        (
            "kv_indptr",
            torch.tensor([0.0, 3.0]),
            "kv_indptr must be a 1-D int32 or int64 tensor, got torch.float32",
        ),
        (
            "kv_indices",
            torch.zeros(1, 3, dtype=torch.int64),
            r"kv_indices must be a 1-D .* got torch.int64 of shape \(1, 3\)",
        ),
        (
            "out_cache_loc",
            torch.zeros(4, dtype=torch.int16),
            "out_cache_loc must be a 1-D int32 or int64 tensor",
        ),
        ("mask_indptr", torch.tensor([0.0, 28.0]), "mask_indptr must be a 1-D int32 or int64 tensor"),
        (
            "custom_mask",
            torch.ones(28),
            "custom_mask must be None or a 1-D bool or uint8 tensor, got torch.float32",
        ),
        (
            "custom_mask",
            torch.ones(4, 7, dtype=torch.bool),
            r"custom_mask must be .* got torch.bool of shape \(4, 7\)",
        ),
        ("max_len_extend", 2.5, "max_len_extend must be an int, got 2.5"),
        ("max_len_extend", None, "max_len_extend must be an int, got None"),
        ("prefix_len_sum", 3.0, "prefix_len_sum must be an int or None, got 3.0"),
    ],
)
def test_the_conversion_names_an_argument_of_the_wrong_type(name: str, value: object, message: str) -> None:
    mask, mask_indptr = custom_mask_from_parents([(-1, 0, 0, 1)], [3])
    args = {
        "qo_indptr": torch.tensor([0, 4], dtype=torch.int32),
        "kv_indptr": torch.tensor([0, 3], dtype=torch.int32),
        "kv_indices": torch.arange(3),
        "out_cache_loc": torch.arange(100, 104),
        "custom_mask": mask,
        "mask_indptr": mask_indptr,
        "max_len_extend": 4,
    }
    verify_metadata_from_sglang(**args)
    args[name] = value
    with pytest.raises(ValueError, match=message):
        verify_metadata_from_sglang(**args)


def test_the_v_buffer_message_says_which_half_is_wrong() -> None:
    args = sglang_verify_args(random_batch(random.Random(2)))
    o = torch.empty(args.q_extend.shape[0], args.q_extend.shape[1], V_DIM, dtype=torch.bfloat16)
    positional = list(args.kernel_kwargs(o).values())
    with pytest.raises(ValueError, match="width 576") as e:
        extend_attention_fwd(
            *positional[:5], positional[4], *positional[6:], out_cache_loc=args.out_cache_loc
        )
    assert "another address" not in str(e.value)
    with pytest.raises(ValueError, match="another address than k_buffer") as e:
        extend_attention_fwd(
            *positional[:5],
            positional[4][..., :V_DIM].clone(),
            *positional[6:],
            out_cache_loc=args.out_cache_loc,
        )
    assert "width" not in str(e.value)


# The conversion by kernel/sglang_metadata.py (Triton), against the torch conversion above. On
# the CPU it runs in Triton's interpreter, in a child process: triton reads TRITON_INTERPRET when
# a kernel is decorated (tests/test_sglang_baseline.py says why it must not be set here).

CONVERT_CHILD = """
import sys, torch
import kernel.sglang_adapter as adapter
cases = torch.load(sys.argv[1], weights_only=True)
results = []
for case in cases:
    got = adapter.verify_metadata_from_sglang(**case)
    results.append({name: getattr(got, name) for name in
                    ("kv_indices", "kv_indptr", "qo_indptr", "tree_mask", "tree_mask_indptr")})
    results[-1]["by_triton"] = adapter._by_triton(case["kv_indices"])
results.append("kernel.sglang_metadata" in sys.modules)
torch.save(results, sys.argv[2])
"""

FIELDS = ("kv_indices", "kv_indptr", "qo_indptr", "tree_mask", "tree_mask_indptr")


def sglang_cases_with_graph_buffers(seeds: range) -> list[tuple[VerifyBatch, dict]]:
    """SGLang's metadata as its CUDA-graph mode holds it: kv_indices over-allocated (a tail of
    slots that must never be copied), qo_indptr int64, custom_mask uint8; some with
    prefix_len_sum, a max_len_extend above the largest draft, no custom_mask, is_causal off."""
    cases = []
    for seed in seeds:
        rng = random.Random(seed)
        batch = random_batch(rng, max_prefix=2000, draft_sizes=(1, 4, 16, 33, 64))
        args = sglang_verify_args(batch)
        spare = torch.full((rng.randint(0, 3000),), 10**9, dtype=torch.int64)
        case = {
            "qo_indptr": args.qo_indptr.to(torch.int64),
            "kv_indptr": args.kv_indptr,
            "kv_indices": torch.cat([args.kv_indices, spare]),
            "out_cache_loc": args.out_cache_loc,
            "custom_mask": args.custom_mask.to(torch.uint8) if seed % 3 else args.custom_mask,
            "mask_indptr": args.mask_indptr,
            "max_len_extend": args.max_len_extend + (rng.choice((0, 0, 40)) if seed % 5 else 0),
            "is_causal": seed % 7 != 3,
        }
        if seed % 2:
            case["prefix_len_sum"] = sum(batch.prefix_lens)
        if seed % 4 == 3:
            case["custom_mask"] = case["mask_indptr"] = None
        cases.append((batch, case))
    return cases


def run_child(tmp_path, cases: list[dict], script: str = CONVERT_CHILD) -> list:
    torch.save(cases, tmp_path / "cases.pt")
    child = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=180,  # a store past its buffer can leave the interpreter hung: a failure too
    )
    assert child.returncode == 0, child.stderr[-4000:]
    return torch.load(tmp_path / "out.pt", weights_only=True)


def assert_same_metadata(got, ref, batch: VerifyBatch | None, where: str) -> None:
    """Everything the kernel reads equal: the indptrs, and the slots and mask words they address
    (the tails past them may differ: unwritten by the Triton kernel, zero by torch)."""
    for name in ("kv_indptr", "qo_indptr", "tree_mask_indptr"):
        assert torch.equal(got[name].cpu(), getattr(ref, name).cpu()), f"{where}: {name}"
    end, words = int(ref.kv_indptr[-1]), int(ref.tree_mask_indptr[-1])
    assert got["kv_indices"].shape == ref.kv_indices.shape and got["tree_mask"].shape == ref.tree_mask.shape
    assert torch.equal(got["kv_indices"][:end].cpu(), ref.kv_indices[:end].cpu()), f"{where}: kv_indices"
    assert torch.equal(got["tree_mask"][:words].cpu(), ref.tree_mask[:words].cpu()), f"{where}: tree_mask"
    if batch is not None:
        assert torch.equal(got["kv_indices"][:end].cpu(), batch.kv_indices.cpu()), (
            f"{where}: the batch's slots"
        )


def test_triton_conversion_equals_the_batch_and_the_torch_conversion_in_the_interpreter(tmp_path) -> None:
    pairs = sglang_cases_with_graph_buffers(range(28))
    assert {c["custom_mask"] is None for _, c in pairs} == {True, False}
    assert {c["is_causal"] for _, c in pairs} == {True, False}
    results = run_child(tmp_path, [case for _, case in pairs])
    assert results.pop() is True, "the child never imported kernel.sglang_metadata"
    for seed, ((batch, case), got) in enumerate(zip(pairs, results, strict=True)):
        assert got["by_triton"]
        assert_same_metadata(got, verify_metadata_from_sglang(**case), batch, f"seed {seed}")
        if case["custom_mask"] is not None and case["is_causal"]:
            tree_mask, tree_mask_indptr = pack_parents(batch.parents)
            assert torch.equal(got["tree_mask_indptr"], tree_mask_indptr)
            assert torch.equal(got["tree_mask"][: int(tree_mask_indptr[-1])], tree_mask)


def test_the_conversion_path_follows_the_device_the_interpreter_and_triton(monkeypatch) -> None:
    cpu = torch.zeros(3, dtype=torch.int64)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not sglang_adapter._by_triton(cpu)
    assert not sglang_adapter._by_triton(cpu.to("meta"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sglang_adapter._by_triton(cpu) == sglang_adapter._have_triton()
    monkeypatch.setattr(sglang_adapter, "_have_triton", lambda: False)
    assert not sglang_adapter._by_triton(cpu)


BOUNDS_CHILD = """
import sys, torch
from kernel.sglang_metadata import convert
calls = torch.load(sys.argv[1], weights_only=True)
outs = []
for call in calls:
    got = convert(**call)
    outs.append({"kv_indices": call["out_kv_indices"], "tree_mask": got.tree_mask})
torch.save(outs, sys.argv[2])
"""

SENTINEL = 777_777


def test_triton_conversion_stays_in_its_buffers_when_sglang_breaks_a_precondition(tmp_path) -> None:
    """kv_indices shorter than kv_indptr addresses, out_cache_loc shorter than qo_indptr's,
    custom_mask shorter than mask_indptr's blocks, an output shorter than the step's slots (a
    prefix_len_sum below the sum), and a max_len_extend below the drafts (fewer mask words than
    the rows need): every input is a view of a longer buffer whose tail holds a sentinel (1 in
    the mask), so a load past an end would copy it, and the slot output is a view whose tail a
    store past out_len would overwrite. Slots both buffers hold are right; the rest read 0."""
    ((batch, case),) = sglang_cases_with_graph_buffers(range(103, 104))  # 8 requests
    prefix_sum, n = sum(batch.prefix_lens), batch.q.shape[0]
    assert prefix_sum > 40 and n > 2 and max(batch.num_draft) > 32, "the case needs slots and words to cut"

    def view_of_longer(t: torch.Tensor, keep: int, sentinel: int) -> torch.Tensor:
        return torch.cat([t[:keep], torch.full((64,), sentinel, dtype=t.dtype)])[:keep]

    kv_indices = view_of_longer(case["kv_indices"], prefix_sum // 2, SENTINEL)
    out_cache_loc = view_of_longer(case["out_cache_loc"], n // 2, SENTINEL)
    custom_mask = view_of_longer(torch.zeros(0, dtype=torch.uint8), 0, 1)
    out_len = (prefix_sum + n) * 2 // 3
    out = torch.full((out_len + 64,), -SENTINEL, dtype=torch.int32)
    call = {
        "qo_indptr": case["qo_indptr"],
        "kv_indptr": case["kv_indptr"],
        "kv_indices": kv_indices,
        "out_cache_loc": out_cache_loc,
        "custom_mask": custom_mask,
        "mask_indptr": torch.zeros_like(case["qo_indptr"]),  # every block at 0, past the empty mask
        "words_max": 1,  # max_len_extend 32 against drafts of up to 64
        "is_causal": False,
        "out_len": out_len,
        "out_kv_indices": out,
    }
    (got,) = run_child(tmp_path, [call], BOUNDS_CHILD)
    slots = got["kv_indices"]
    assert not (slots == SENTINEL).any(), "a slot load read past its buffer's end"
    assert (slots[out_len:] == -SENTINEL).all(), "a store wrote past out_len"
    words = got["tree_mask"]
    assert words.numel() == n // 2, "one word for each of out_cache_loc's entries"
    # The rows' first words (words_max = 1) where the buffer holds them: all 0, the mask's bytes
    # past its (empty) end never read. The rows need more words than the buffer holds.
    written, word0 = [], 0
    for t in batch.num_draft:
        written += [word0 + i * ((t + 31) // 32) for i in range(t)]
        word0 += t * ((t + 31) // 32)
    assert word0 > words.numel() and max(written) >= words.numel()
    inside = [w for w in written if w < words.numel()]
    assert len(inside) > 10 and not words[inside].any(), "a mask load read past custom_mask's end"
    # What the full buffers would give, position by position, where the cut buffers hold it.
    full = sglang_adapter._convert_torch(
        case["qo_indptr"], case["kv_indptr"], case["kv_indices"], case["out_cache_loc"], None, None, 32, False,
        prefix_sum + n,
    ).kv_indices  # fmt: skip
    kvp, qo = case["kv_indptr"].tolist(), case["qo_indptr"].tolist()
    for b in range(len(kvp) - 1):
        prefix = kvp[b + 1] - kvp[b]
        for r in range(prefix + qo[b + 1] - qo[b]):
            dst = kvp[b] + qo[b] + r
            if dst >= out_len:
                continue
            held = kvp[b] + r < kv_indices.numel() if r < prefix else qo[b] + r - prefix < n // 2
            assert int(slots[dst]) == (int(full[dst]) if held else 0), (b, r)


# GPU: both kernels on SGLang-format batches.

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None, reason="sglang is not installed"
)


def row_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max relative L2 error, min cosine) over (token, head) rows."""
    a, r = out.double().flatten(0, 1), ref.double().flatten(0, 1)
    rel = (a - r).norm(dim=-1) / r.norm(dim=-1)
    cos = torch.nn.functional.cosine_similarity(a, r, dim=-1)
    return float(rel.max()), float(cos.min())


@pytest.mark.gpu
@needs_sglang
@pytest.mark.parametrize("seed", range(12))
def test_adapter_equals_sglang_triton_and_both_equal_the_reference(seed: int) -> None:
    from harness.impl_sglang import load_kernel
    from harness.oracle import reference

    sglang = load_kernel()
    assert not isinstance(sglang, str), sglang
    rng = random.Random(1000 + seed)
    heads, max_prefix = GPU_SHAPES[seed % len(GPU_SHAPES)]
    batch = random_batch(
        rng, num_heads=heads, max_prefix=max_prefix, same_draft_size=seed % 3 != 0, device="cuda"
    )
    args = sglang_verify_args(batch)
    n, h = batch.q.shape[:2]
    o_sglang = torch.empty(n, h, V_DIM, dtype=torch.bfloat16, device="cuda")
    sglang.extend_attention_fwd(**args.kernel_kwargs(o_sglang))
    o_ours = torch.empty_like(o_sglang)
    # kernel_kwargs is in extend_attention_fwd's parameter order: the adapter takes it positionally.
    extend_attention_fwd(
        *args.kernel_kwargs(o_ours).values(),
        out_cache_loc=args.out_cache_loc,
        prefix_len_sum=sum(batch.prefix_lens),
    )
    ref, _ = reference(batch)
    for label, out in (("sglang", o_sglang), ("adapter", o_ours)):
        rel, cos = row_errors(out, ref)
        assert rel <= REL_TOL and cos >= COS_TOL, f"{label} vs float64: max rel {rel:.3g}, min cos {cos:.6f}"
    rel, cos = row_errors(o_ours, o_sglang)
    assert rel <= REL_TOL and cos >= COS_TOL, f"adapter vs sglang: max rel {rel:.3g}, min cos {cos:.6f}"


@pytest.mark.gpu
def test_adapter_call_syncs_nothing_and_replays_from_a_cuda_graph() -> None:
    batch = random_batch(random.Random(4), num_heads=16, max_prefix=5000, same_draft_size=True, device="cuda")
    args = sglang_verify_args(batch)
    n, h = batch.q.shape[:2]
    o_eager = torch.empty(n, h, V_DIM, dtype=torch.bfloat16, device="cuda")
    o_graph = torch.empty_like(o_eager)

    def call(o: torch.Tensor) -> None:
        extend_attention_fwd(*args.kernel_kwargs(o).values(), out_cache_loc=args.out_cache_loc)

    call(o_eager)  # builds the extension and warms up outside the sync check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call(o_eager)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(o_graph)
    o_graph.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_eager)


@pytest.mark.gpu
def test_triton_conversion_equals_the_torch_conversion_on_the_gpu() -> None:
    for seed, (batch, case) in enumerate(sglang_cases_with_graph_buffers(range(200, 224))):
        cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
        assert sglang_adapter._by_triton(cuda["kv_indices"])
        got = verify_metadata_from_sglang(**cuda)
        ref = sglang_adapter._convert_torch(
            cuda["qo_indptr"], cuda["kv_indptr"], cuda["kv_indices"], cuda["out_cache_loc"], cuda["custom_mask"],
            cuda["mask_indptr"], cuda["max_len_extend"], cuda["is_causal"], got.kv_indices.numel(),
        )  # fmt: skip
        assert_same_metadata({f: getattr(got, f) for f in FIELDS}, ref, batch, f"seed {seed}")


def _batch_in_pool(pool: torch.Tensor, prefix_lens, num_draft: int, num_heads: int, seed: int) -> VerifyBatch:
    """A verify step over an existing pool: random slots, trees and queries (all on pool's device)."""
    rng = random.Random(seed)
    b = len(prefix_lens)
    parents = tuple(random_tree(num_draft, rng.randrange(2**31)) for _ in range(b))
    kv_lens = [p + num_draft for p in prefix_lens]
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(pool.shape[0], generator=g)[: sum(kv_lens)]
    return VerifyBatch(
        q=torch.randn(b * num_draft, num_heads, QK_DIM, generator=g).to(torch.bfloat16).to(pool.device),
        kv_cache=pool,
        kv_indices=slots.to(torch.int32).to(pool.device),
        qo_indptr=torch.arange(0, (b + 1) * num_draft, num_draft, dtype=torch.int32, device=pool.device),
        kv_indptr=torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32).to(
            pool.device
        ),
        prefix_lens=tuple(prefix_lens),
        parents=parents,
        sm_scale=SM_SCALE,
    )


@pytest.mark.gpu
def test_adapter_graph_captured_at_placeholder_lengths_replays_real_steps() -> None:
    """SGLang's CUDA-graph mode: the graph is captured once with placeholder prefixes (length 1)
    over static buffers (kv_indices sized max_num_tokens x max_context_len), and each replay
    follows metadata copied into those buffers in place. Every replay must equal an eager call on
    the step's exact-size metadata, bit for bit, and the float64 reference."""
    from harness.oracle import reference

    b, t, h, max_context = 4, 16, 8, 3000
    g = torch.Generator().manual_seed(7)
    pool = torch.randn(b * (max_context + t) + 100, QK_DIM, generator=g).to(torch.bfloat16).cuda()
    n = b * t
    static = {
        "qo_indptr": torch.arange(0, (b + 1) * t, t, dtype=torch.int64, device="cuda"),
        "kv_indptr": torch.arange(b + 1, dtype=torch.int32, device="cuda"),  # placeholders: P_b = 1
        "kv_indices": torch.zeros(n * max_context, dtype=torch.int64, device="cuda"),
        "out_cache_loc": torch.arange(b, b + n, dtype=torch.int64, device="cuda"),
        "custom_mask": torch.ones(n * (max_context + t), dtype=torch.uint8, device="cuda"),
        "mask_indptr": torch.arange(0, (b + 1) * t * (1 + t), t * (1 + t), dtype=torch.int64, device="cuda"),
    }
    q = torch.zeros(n, h, QK_DIM, dtype=torch.bfloat16, device="cuda")
    o = torch.zeros(n, h, V_DIM, dtype=torch.bfloat16, device="cuda")
    k_buffer = pool.view(-1, 1, QK_DIM)

    def call() -> None:
        meta = verify_metadata_from_sglang(**static, max_len_extend=t)
        extend_attention_fwd(
            q, None, None, o, k_buffer, k_buffer[..., :V_DIM], static["qo_indptr"], static["kv_indptr"],
            static["kv_indices"], static["custom_mask"], True, static["mask_indptr"], t, 1.0, 1.0, SM_SCALE,
            out_cache_loc=static["out_cache_loc"], metadata=meta,
        )  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # builds and warms up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    for step, prefixes in enumerate(((2500, 0, 1, 1800), (37, 2999, 640, 2048), (1, 1, 1, 1))):
        batch = _batch_in_pool(pool, prefixes, t, h, seed=step)
        args = sglang_verify_args(batch)
        static["kv_indptr"].copy_(args.kv_indptr)
        static["kv_indices"][: args.kv_indices.numel()].copy_(args.kv_indices)
        static["out_cache_loc"].copy_(args.out_cache_loc)
        static["custom_mask"][: args.custom_mask.numel()].copy_(args.custom_mask)
        static["mask_indptr"].copy_(args.mask_indptr)
        q.copy_(batch.q)
        o.zero_()
        graph.replay()
        eager = torch.empty_like(o)
        extend_attention_fwd(*args.kernel_kwargs(eager).values(), out_cache_loc=args.out_cache_loc)
        torch.cuda.synchronize()
        assert torch.equal(o, eager), f"step {step}: the replay differs from an eager call"
        rel, cos = row_errors(o, reference(batch)[0])
        assert rel <= REL_TOL and cos >= COS_TOL, f"step {step}: max rel {rel:.3g}, min cos {cos:.6f}"


@pytest.mark.gpu
def test_adapter_validate_checks_an_eager_call_and_changes_nothing_else() -> None:
    batch = random_batch(random.Random(12), num_heads=8, max_prefix=3000, device="cuda")
    args = sglang_verify_args(batch)
    n, h = batch.q.shape[:2]
    o_plain = torch.empty(n, h, V_DIM, dtype=torch.bfloat16, device="cuda")
    o_checked = torch.empty_like(o_plain)
    # SGLang's kv_indices over-allocated, as its buffers are: validate slices to what is addressed.
    spare = torch.full((64,), 10**9, dtype=args.kv_indices.dtype, device="cuda")
    kwargs = args.kernel_kwargs(o_plain)
    kwargs["kv_indices"] = torch.cat([args.kv_indices, spare])
    extend_attention_fwd(*kwargs.values(), out_cache_loc=args.out_cache_loc)
    kwargs["o_extend"] = o_checked
    extend_attention_fwd(*kwargs.values(), out_cache_loc=args.out_cache_loc, validate=True)
    assert torch.equal(o_plain, o_checked)
    assert max(batch.num_draft) == 64
    low = dict(kwargs, max_len_extend=63)
    with pytest.raises(ValueError, match="max_len_extend = 63"):
        extend_attention_fwd(*low.values(), out_cache_loc=args.out_cache_loc, validate=True)
    bad_slot = args.out_cache_loc.clone()
    bad_slot[0] = batch.kv_cache.shape[0] + 7
    with pytest.raises((RuntimeError, ValueError), match="outside the pool"):
        extend_attention_fwd(*kwargs.values(), out_cache_loc=bad_slot, validate=True)


def test_metadata_built_once_is_used_as_given_and_nothing_is_converted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's conversion, built once and passed to every layer's call: the call hands the
    kernel exactly those tensors and converts nothing itself."""
    from kernel import sglang_adapter

    args = sglang_verify_args(random_batch(random.Random(6)))
    o = torch.empty(args.q_extend.shape[0], args.q_extend.shape[1], V_DIM, dtype=torch.bfloat16)
    meta = convert(args)
    seen = {}
    monkeypatch.setattr(sglang_adapter, "verify_attention", lambda *a, **kw: seen.update(args=a, kwargs=kw))

    def no_conversion(*a, **kw):
        raise AssertionError("converted again")

    monkeypatch.setattr(sglang_adapter, "verify_metadata_from_sglang", no_conversion)
    for _ in range(3):  # three layers of one step
        seen.clear()
        extend_attention_fwd(*args.kernel_kwargs(o).values(), out_cache_loc=args.out_cache_loc, metadata=meta)
        kv_indices, qo_indptr, kv_indptr, tree_mask, tree_mask_indptr = (seen["args"][i] for i in range(2, 7))
        assert kv_indices is meta.kv_indices and kv_indptr is meta.kv_indptr and qo_indptr is meta.qo_indptr
        assert tree_mask is meta.tree_mask and tree_mask_indptr is meta.tree_mask_indptr
        assert seen["kwargs"]["out"] is o


def test_adapter_validate_names_a_moved_mask_block_before_the_kernel_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = sglang_verify_args(random_batch(random.Random(6)))
    o = torch.empty(args.q_extend.shape[0], args.q_extend.shape[1], V_DIM, dtype=torch.bfloat16)
    calls = []
    monkeypatch.setattr(sglang_adapter, "verify_attention", lambda *a, **kw: calls.append(kw))
    kwargs = args.kernel_kwargs(o)
    extend_attention_fwd(*kwargs.values(), out_cache_loc=args.out_cache_loc, validate=True)
    assert calls and calls[0]["validate"] is True
    kwargs["custom_mask"] = torch.cat([args.custom_mask, args.custom_mask])
    kwargs["mask_indptr"] = args.mask_indptr + args.custom_mask.numel()  # a copy's blocks: a stale step's
    with pytest.raises(ValueError, match=r"mask_indptr\[0\] = \d+; expected 0"):
        extend_attention_fwd(*kwargs.values(), out_cache_loc=args.out_cache_loc, validate=True)
    assert len(calls) == 1
