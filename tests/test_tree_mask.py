"""kernel/tree_mask.py: the kernel's packed visibility, and its errors on bad trees and masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernel.tree_mask
from kernel.tree_mask import pack_parents, pack_visibility, visibility_from_parents, words_per_row


def test_bits_are_self_and_ancestors_in_row_major_words() -> None:
    # 0 <- 1 <- 2, 0 <- 3: row i's bit k is "i sees k".
    tree_mask, indptr = pack_parents([[-1, 0, 1, 0]])
    assert tree_mask.tolist() == [0b0001, 0b0011, 0b0111, 0b1001]
    assert indptr.tolist() == [0, 4]


def test_rows_past_32_tokens_take_two_words_and_bit_31_is_the_sign() -> None:
    parents = [-1, *range(32)]  # a chain of 33: row 31 sees bits 0..31, row 32 spills into word 1
    tree_mask, indptr = pack_parents([parents])
    assert words_per_row(33) == 2 and indptr.tolist() == [0, 66]
    rows = tree_mask.view(33, 2)
    assert rows[31].tolist() == [-1, 0] and rows[32].tolist() == [-1, 1]


def test_parents_as_numpy_or_torch_integers_are_accepted() -> None:
    expected = pack_parents([[-1, 0, 1]])
    for parents in (np.array([-1, 0, 1]), torch.tensor([-1, 0, 1]), [np.int64(-1), np.int32(0), 1]):
        got = pack_parents([parents])
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_an_empty_batch_packs_to_an_empty_mask() -> None:
    for packed in (pack_parents([]), pack_visibility([])):
        assert packed[0].numel() == 0 and packed[0].dtype == torch.int32
        assert packed[1].tolist() == [0]


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ([[]], "parents[0] is empty"),
        ([[-1, 0], [0]], "parents[1][0] = 0: the root"),
        ([[-1, 2, 0]], "parents[0][1] = 2: a parent must be a node in [0, 1)"),
        ([[-1, -1]], "parents[0][1] = -1"),
        ([[-1, 0.5]], "parents[0][1] = 0.5: a parent is a node index"),
        ([[-1, 0, True]], "parents[0][2] = True: a parent is a node index (an int), not a bool"),
        ([[-1, "0"]], "parents[0][1] = '0'"),
    ],
)
def test_a_bad_tree_is_refused_naming_the_entry(parents: list, message: str) -> None:
    with pytest.raises(ValueError) as e:
        pack_parents(parents)
    assert message in str(e.value)


def test_visibility_from_parents_names_its_field() -> None:
    with pytest.raises(ValueError, match=r"tree\[1\] = 1"):
        visibility_from_parents([-1, 1], field="tree")


def test_integer_visibility_of_zeros_and_ones_packs_as_bool() -> None:
    vis = torch.tensor([[1, 0], [1, 1]])
    expected = pack_visibility([vis.bool()])
    for m in (vis, vis.to(torch.uint8), vis.tolist()):
        got = pack_visibility([m])
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize(
    "vis",
    [
        torch.tensor([[2, 0], [1, 1]]),  # a 2 would set the neighbouring bit
        torch.tensor([[1, 0], [-1, 1]]),
        torch.tensor([[255, 0], [255, 255]], dtype=torch.uint8),
        torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
    ],
)
def test_visibility_other_than_bool_or_zero_one_is_refused(vis: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"visibility\[0\] must be bool"):
        pack_visibility([vis])


def test_a_non_square_visibility_is_refused() -> None:
    with pytest.raises(ValueError, match=r"visibility\[1\] must be a non-empty square"):
        pack_visibility([torch.ones(1, 1, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)])


def test_a_single_tree_or_a_non_sequence_is_refused_naming_the_batch() -> None:
    with pytest.raises(ValueError, match=r"parents\[0\] = -1 is not a parent array.*wrap a single tree"):
        pack_parents([-1, 0, 1])
    with pytest.raises(ValueError, match="parents must be a sequence of parent arrays"):
        pack_parents(None)
    with pytest.raises(ValueError, match="visibility must be a sequence of .* matrices"):
        pack_visibility(torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"visibility\[0\] must be a \[T, T\] bool matrix, got None"):
        pack_visibility([None])


@pytest.mark.parametrize("num_draft", [-100, -1, 2.5, True, "3"])
def test_words_per_row_takes_a_count_only(num_draft: object) -> None:
    with pytest.raises(ValueError, match="num_draft must be an int >= 0"):
        words_per_row(num_draft)


def test_packing_in_row_blocks_gives_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    # The packer bounds its scratch by packing a tree's rows a block at a time; a block of one
    # row (forced here) must give the words of the whole tree packed at once.
    gen = torch.Generator().manual_seed(0)
    vis = [torch.rand(t, t, generator=gen) < 0.5 for t in (1, 31, 32, 33, 70)]
    whole = pack_visibility(vis)
    monkeypatch.setattr(kernel.tree_mask, "_PACK_SCRATCH_ELEMS", 1)
    blocks = pack_visibility(vis)
    assert all(torch.equal(a, b) for a, b in zip(whole, blocks, strict=True))
    assert whole[0].unique().numel() > 10  # the draws set bit 31 and others, not only zeros
