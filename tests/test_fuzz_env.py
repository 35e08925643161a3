"""The GPU fuzz's settings from the environment (tests/fuzz_env.py), on the CPU."""

from __future__ import annotations

import pytest
from fuzz_env import CASES_VAR, CONFIG_SEEDS, DEFAULT_CASES, SEED_VAR, fuzz_seed, fuzz_settings


def test_defaults_are_the_suites_own_cases_and_seeds() -> None:
    assert fuzz_settings({}) == (DEFAULT_CASES, 0)
    assert fuzz_settings({CASES_VAR: " ", SEED_VAR: ""}) == (DEFAULT_CASES, 0)
    assert all(fuzz_seed(b, 0) == b for b in CONFIG_SEEDS.values())


def test_a_soak_sets_both() -> None:
    assert fuzz_settings({CASES_VAR: "1000", SEED_VAR: "7"}) == (1000, 7)


def test_offsets_never_give_two_configs_the_same_draws() -> None:
    seeds = [fuzz_seed(b, k) for b in CONFIG_SEEDS.values() for k in range(50)]
    assert len(set(seeds)) == len(seeds)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({CASES_VAR: "many"}, f"{CASES_VAR}='many': expected a whole number >= 1"),
        ({CASES_VAR: "0"}, f"{CASES_VAR}=0: expected a whole number >= 1"),
        ({CASES_VAR: "2.5"}, f"{CASES_VAR}='2.5': expected a whole number >= 1"),
        ({SEED_VAR: "-1"}, f"{SEED_VAR}=-1: expected a whole number >= 0"),
        ({SEED_VAR: "x"}, f"{SEED_VAR}='x': expected a whole number >= 0"),
    ],
)
def test_a_bad_value_names_the_variable_and_what_was_expected(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        fuzz_settings(env)
