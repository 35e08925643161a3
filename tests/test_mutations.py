"""Mutation controls: parity catches every mutant on the CI bundles, and passes the bf16 control."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from harness import bundles, mutations, parity, tree
from harness.batch import V_DIM, VerifyBatch
from harness.registry import implementations

CI_BUNDLES = ["smoke", "ddtree", "ragged"]
LARGE = ["kimi-k2-tp8", "two-long", "deepseek-v3-200k"]


def run(
    name: str, impl_name: str, bundle: Callable[[str], bundles.Bundle], batch: Callable[[str], VerifyBatch]
):
    impl = next(i for i in [mutations.control(), *mutations.mutants()] if i.name == impl_name)
    return parity.run_one(bundle(name), batch(name), impl)


# DESIGN.md section 4's list, each by the mutant (or mutants) that play it here.
DESIGN_MUTATIONS = {
    "causal instead of tree mask": {"causal-mask"},
    "one draft token's mask bit flipped": {"mask-bit-flip", "mask-shows-later"},
    "first prefix token dropped": {"drop-first-prefix"},
    "last prefix token dropped": {"drop-last-prefix"},
    "an off-by-one split boundary": {"split-skip", "split-overlap"},
    "RoPE part ignored": {"rope-ignored"},
    "wrong sm_scale": {"wrong-sm-scale"},
}


def test_every_mutation_the_design_requires_is_a_mutant() -> None:
    """The test below runs whatever MUTANTS holds: this one keeps that list from shrinking."""
    assert set().union(*DESIGN_MUTATIONS.values()) <= set(mutations.MUTANTS)


@pytest.mark.parametrize("mutant", [f"mutant:{m}" for m in mutations.MUTANTS])
def test_each_mutant_fails_parity_on_a_ci_bundle(
    mutant: str, bundle: Callable[[str], bundles.Bundle], batch: Callable[[str], VerifyBatch]
) -> None:
    rows = [run(name, mutant, bundle, batch) for name in CI_BUNDLES]
    assert not any(r.status == "error" for r in rows), [r.reason for r in rows]
    assert any(r.status == "fail" for r in rows), f"{mutant} passed parity on {', '.join(CI_BUNDLES)}"


@pytest.mark.parametrize("name", CI_BUNDLES)
def test_the_bf16_rounded_oracle_passes(
    name: str, bundle: Callable[[str], bundles.Bundle], batch: Callable[[str], VerifyBatch]
) -> None:
    row = run(name, "control:oracle-bf16", bundle, batch)
    assert row.status == "pass", row.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_the_bf16_rounded_oracle_passes_a_large_bundle(
    name: str, bundle: Callable[[str], bundles.Bundle], batch: Callable[[str], VerifyBatch]
) -> None:
    row = run(name, "control:oracle-bf16", bundle, batch)
    assert row.status == "pass", row.reason


def test_mutants_stay_out_of_the_registry() -> None:
    names = {i.name for i in implementations()}
    assert not any(n.startswith(("mutant:", "control:")) for n in names)


def test_split_skip_drops_each_later_split_start() -> None:
    positions = mutations._split_positions(600, +1)
    assert len(positions) == 598 and 256 not in positions and 512 not in positions


def test_split_overlap_counts_each_split_boundary_twice() -> None:
    positions = mutations._split_positions(600, -1)
    assert len(positions) == 602 and positions.count(255) == 2 and positions.count(511) == 2


def test_split_mutants_change_nothing_below_one_split() -> None:
    assert mutations._split_positions(mutations.SPLIT, +1) == list(range(mutations.SPLIT))


# Each mutant must break the batch in exactly the way its name says: a mutant that quietly ran
# another's code (or nothing) would still fail parity somewhere, and DESIGN.md's mutation would
# then go unrun. The oracle is replaced by a recorder of what each mutant hands it.


def _handed_to_oracle(name: str, batch: VerifyBatch, monkeypatch: pytest.MonkeyPatch) -> dict:
    seen: dict = {}

    def record(b: VerifyBatch, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        seen.update(kwargs, batch=b)
        return torch.zeros(0), torch.zeros(0)

    monkeypatch.setattr(mutations, "reference", record)
    mutations.MUTANTS[name][1](batch)
    return seen


def _slots(batch: VerifyBatch, b: int) -> list[int]:
    kv = batch.kv_indptr.tolist()
    return batch.kv_indices[kv[b] : kv[b + 1]].tolist()


PREFIX_MUTANTS: dict[str, Callable[[int], list[int]]] = {
    "drop-first-prefix": lambda p: list(range(1, p)),
    "drop-last-prefix": lambda p: list(range(p - 1)),
    "split-skip": lambda p: mutations._split_positions(p, +1),
    "split-overlap": lambda p: mutations._split_positions(p, -1),
}


@pytest.mark.parametrize("name", PREFIX_MUTANTS)
def test_each_prefix_mutant_reads_exactly_its_named_prefix_positions(
    name: str, batch: Callable[[str], VerifyBatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = batch("ragged")  # prefixes 0, 1, 777, 8192, 30001: past several split boundaries
    mutated = _handed_to_oracle(name, original, monkeypatch)["batch"]
    assert mutated.parents == original.parents and torch.equal(mutated.q, original.q)
    for b, p in enumerate(original.prefix_lens):
        slots = _slots(original, b)
        expected = [slots[i] for i in PREFIX_MUTANTS[name](p)] + slots[p:]
        assert _slots(mutated, b) == expected, f"request {b} (P={p})"
        assert mutated.prefix_lens[b] == len(expected) - len(original.parents[b])
    assert _slots(mutated, 4) != _slots(original, 4)  # P=30001: every mutant moves something


def test_the_prefix_positions_are_the_named_ones() -> None:
    assert PREFIX_MUTANTS["drop-first-prefix"](5) == [1, 2, 3, 4]
    assert PREFIX_MUTANTS["drop-last-prefix"](5) == [0, 1, 2, 3]


@pytest.mark.parametrize(("name", "bit"), [("mask-bit-flip", (1, 0)), ("mask-shows-later", (0, 1))])
def test_each_mask_mutant_flips_exactly_its_named_bit(
    name: str, bit: tuple[int, int], batch: Callable[[str], VerifyBatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = batch("ragged")  # request 0 has a single draft token: the flip lands in request 1
    seen = _handed_to_oracle(name, original, monkeypatch)
    assert seen["batch"] is original
    trees = [tree.visibility(p) for p in original.parents]
    diffs = [torch.nonzero(v != t).tolist() for v, t in zip(seen["visibility"], trees, strict=True)]
    assert diffs == [[], [list(bit)], [], [], []]
    assert bool(seen["visibility"][1][bit]) == (name == "mask-shows-later")


def test_the_causal_mutant_replaces_every_tree_by_a_chain(
    batch: Callable[[str], VerifyBatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = batch("ragged")
    mutated = _handed_to_oracle("causal-mask", original, monkeypatch)["batch"]
    assert mutated.parents == tuple(tree.chain(len(p)) for p in original.parents) != original.parents
    assert (
        torch.equal(mutated.kv_indices, original.kv_indices) and mutated.prefix_lens == original.prefix_lens
    )


def test_the_rope_and_scale_mutants_change_only_their_part(
    batch: Callable[[str], VerifyBatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = batch("smoke")
    no_rope = _handed_to_oracle("rope-ignored", original, monkeypatch)["batch"]
    assert torch.equal(no_rope.q[..., :V_DIM], original.q[..., :V_DIM])
    assert not no_rope.q[..., V_DIM:].any() and original.q[..., V_DIM:].any()
    scaled = _handed_to_oracle("wrong-sm-scale", original, monkeypatch)["batch"]
    assert scaled.sm_scale == 1 / math.sqrt(576) != original.sm_scale
    assert torch.equal(scaled.q, original.q) and torch.equal(scaled.kv_indices, original.kv_indices)


def test_the_bf16_control_rounds_what_it_returns(
    bundle: Callable[[str], bundles.Bundle], batch: Callable[[str], VerifyBatch]
) -> None:
    """Unrounded, the control would be the oracle against its own goldens: a control that cannot fail."""
    out, lse = mutations._rounded_oracle(batch("smoke"))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    row = run("smoke", "control:oracle-bf16", bundle, batch)
    assert row.status == "pass" and 1e-4 < row.max_rel_err < 1e-2  # bf16's rounding, inside the tolerance
    # fp32 accumulation, not the goldens' own lse: the control's lse tests the lse tolerance too
    assert 0 < row.max_lse_abs_err < 1e-4
