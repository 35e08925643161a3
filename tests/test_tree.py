"""Parent arrays, visibility, SGLang's custom_mask and the seeded tree builders."""

from __future__ import annotations

import pytest
import torch

from harness import tree

BUILDERS = {
    "chain": lambda t, seed: tree.chain(t),
    "ddtree": tree.ddtree,
    "eagle_tree": tree.eagle_tree,
    "random_tree": tree.random_tree,
}
SIZES = (1, 2, 4, 16, 33, 64, 256)


def depths(parents: tuple[int, ...]) -> list[int]:
    d = [0] * len(parents)
    for i, p in enumerate(parents[1:], start=1):
        d[i] = d[p] + 1
    return d


def test_visibility_is_self_and_ancestors() -> None:
    #      0
    #     / \
    #    1   2
    #    |   |
    #    3   4
    vis = tree.visibility((-1, 0, 0, 1, 2))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 0, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 0, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(vis, expected)


def test_chain_visibility_is_causal() -> None:
    assert torch.equal(tree.visibility(tree.chain(7)), torch.ones(7, 7, dtype=torch.bool).tril())


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ((-1, 0, 1, 2, 3, 7), r"parents\[5\] = 7 comes after node 5; a parent must precede its child"),
        ((-1, 0, 2), r"parents\[2\] = 2 comes after node 2"),
        ((0, 0), r"parents\[0\] = 0; the root \(node 0\) must have parent -1"),
        ((-1, 0, -1), r"parents\[2\] = -1; only the root"),
        ((), r"parents is empty"),
        ((-1, 0.9, 1.5), r"parents\[1\] = 0.9: a parent is a node index"),  # int() would make it (-1, 0, 1)
        ((-1, "0"), r"parents\[1\] = '0': a parent is a node index"),
        ((-1, True), r"parents\[1\] = True: a parent is a node index \(an int\), not a bool"),
        (None, r"parents must be a sequence of parent indices, got NoneType"),
    ],
)
def test_validate_parents_names_the_bad_entry(parents: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tree.validate_parents(parents)


@pytest.mark.parametrize("name", BUILDERS)
def test_parents_from_visibility_inverts_visibility(name: str) -> None:
    parents = BUILDERS[name](33, 5)
    assert tree.parents_from_visibility(tree.visibility(parents)) == parents


def test_parents_from_visibility_rejects_a_non_tree() -> None:
    vis = tree.visibility((-1, 0, 1))
    vis[2, 0] = False  # node 2 sees its parent but not its grandparent
    with pytest.raises(
        ValueError, match=r"visibility\[2, 0\] = False but a tree with parents \(-1, 0, 1\) gives True"
    ):
        tree.parents_from_visibility(vis)


def test_custom_mask_layout_matches_sglang() -> None:
    # Request 0: P=2, T=2 chain; request 1: P=0, T=3 with nodes 1 and 2 both children of the root.
    mask, indptr = tree.custom_mask_from_parents([(-1, 0), (-1, 0, 0)], [2, 0])
    assert indptr.tolist() == [0, 2 * 4, 2 * 4 + 3 * 3]
    assert indptr.dtype == torch.int64
    assert mask[:8].view(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert mask[8:].view(3, 3).tolist() == [[True, False, False], [True, True, False], [True, False, True]]


@pytest.mark.parametrize("name", BUILDERS)
def test_custom_mask_round_trip(name: str) -> None:
    trees = [BUILDERS[name](t, 3) for t in (1, 4, 16, 64)]
    prefix_lens = [0, 1, 777, 5]
    mask, indptr = tree.custom_mask_from_parents(trees, prefix_lens)
    back = tree.visibility_from_custom_mask(mask, indptr, prefix_lens, [len(t) for t in trees])
    for t, vis in zip(trees, back, strict=True):
        assert torch.equal(vis, tree.visibility(t))
        assert tree.parents_from_visibility(vis) == t


def test_custom_mask_with_a_hidden_prefix_token_is_rejected() -> None:
    mask, indptr = tree.custom_mask_from_parents([(-1, 0)], [3])
    mask[1 * 5 + 2] = False  # draft token 1 no longer sees prefix token 2
    with pytest.raises(ValueError, match="request 0: draft token 1 does not see prefix token 2"):
        tree.visibility_from_custom_mask(mask, indptr, [3], [2])


def test_custom_mask_with_a_wrong_indptr_is_rejected() -> None:
    mask, _ = tree.custom_mask_from_parents([(-1, 0)], [3])
    with pytest.raises(
        ValueError,
        match=r"mask_indptr\[1\] - mask_indptr\[0\] = 9, expected T \* \(P \+ T\) = 2 \* \(3 \+ 2\) = 10",
    ):
        tree.visibility_from_custom_mask(mask, torch.tensor([0, 9]), [3], [2])


@pytest.mark.parametrize(
    ("mask_indptr", "prefix_lens", "num_draft", "message"),
    [
        ([-10, 0], [3], [2], r"mask_indptr\[0\] = -10; expected >= 0"),  # would wrap to the mask's end
        ([0.0, 10.0], [3], [2], r"mask_indptr must be a 1-D integer tensor"),
        ([0, 10], [3], [0], r"num_draft\[0\] = 0; expected >= 1"),
        ([0, 10], [-1], [2], r"prefix_lens\[0\] = -1; expected >= 0"),
        ([0, 10], [2.5], [2], r"prefix_lens\[0\] = 2.5: expected an int >= 0"),
    ],
)
def test_custom_mask_metadata_out_of_range_is_named(
    mask_indptr: list, prefix_lens: list, num_draft: list, message: str
) -> None:
    mask, _ = tree.custom_mask_from_parents([(-1, 0)], [3])
    with pytest.raises(ValueError, match=message):
        tree.visibility_from_custom_mask(mask, torch.tensor(mask_indptr), prefix_lens, num_draft)


def test_custom_mask_of_an_empty_batch_is_empty() -> None:
    mask, indptr = tree.custom_mask_from_parents([], [])
    assert mask.numel() == 0 and mask.dtype == torch.bool and indptr.tolist() == [0]


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("size", SIZES)
def test_builders_give_valid_trees_of_the_requested_size(name: str, size: int) -> None:
    parents = BUILDERS[name](size, 11)
    assert len(parents) == size
    assert tree.validate_parents(parents) == parents
    assert all(type(p) is int for p in parents)


@pytest.mark.parametrize("name", ["ddtree", "eagle_tree", "random_tree"])
def test_builders_are_deterministic_and_seeded(name: str) -> None:
    build = BUILDERS[name]
    assert build(64, 7) == build(64, 7)
    assert len({build(64, seed) for seed in range(5)}) > 1


@pytest.mark.parametrize("name", BUILDERS)
def test_builders_reject_an_empty_tree(name: str) -> None:
    with pytest.raises(ValueError, match="num_draft = 0"):
        BUILDERS[name](0, 1)


def test_chain_is_a_single_path() -> None:
    assert tree.chain(5) == (-1, 0, 1, 2, 3)


def test_eagle_tree_expands_top_k_over_several_depths() -> None:
    parents = tree.eagle_tree(64, 1)
    kids = tree.children(parents)
    assert max(depths(parents)) >= 3
    assert max(len(k) for k in kids) <= 8  # top-k children per expanded node
    # nodes are numbered by depth, so a breadth-first order
    assert depths(parents) == sorted(depths(parents))


def test_ddtree_is_best_first_over_per_depth_marginals() -> None:
    parents = tree.ddtree(64, 1)
    assert max(depths(parents)) >= 3
    assert max(depths(parents)) <= 16  # one drafter block
    assert max(len(k) for k in tree.children(parents)) <= 8


def test_best_first_takes_the_most_likely_paths_of_the_marginals() -> None:
    """The tree of n nodes holds the n - 1 most likely paths (products of per-depth marginals),
    checked against every path enumerated by brute force."""
    import itertools

    import numpy as np

    rng = np.random.default_rng(3)
    depth_probs = [np.sort(rng.dirichlet(np.ones(3)))[::-1] for _ in range(3)]
    paths = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    prob = {p: float(np.prod([depth_probs[d][r] for d, r in enumerate(p)])) for p in paths}
    for n in (2, 5, 10, 20):
        parents = tree._best_first(n, depth_probs, branch=3)
        kids = tree.children(parents)
        # a node's k-th child (index order) is its k-th most likely: siblings are taken in that order
        path = {0: ()}
        for node, ks in enumerate(kids):
            for rank, child in enumerate(ks):
                path[child] = (*path[node], rank)
        chosen = {path[i] for i in range(1, n)}
        best = set(sorted(paths, key=lambda p: -prob[p])[: n - 1])
        assert chosen == best, n


def test_children_in_index_order() -> None:
    assert tree.children((-1, 0, 0, 1, 0)) == [[1, 2, 4], [3], [], [], []]
