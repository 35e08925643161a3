"""Mutation controls: parity catches every mutant on the CI bundles, and passes the bf16 control."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness import bundles, mutations, parity
from harness.batch import VerifyBatch
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
