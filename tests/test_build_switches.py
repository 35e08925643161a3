"""Every build switch the kernel sources test (``#if``/``#ifdef``/``#ifndef VA_...``) is listed in
the README's table of build switches, and every listed switch is still read by the sources."""

from __future__ import annotations

import re
from pathlib import Path

from kernel.ptxas_check import source_switches

PROJECT = Path(__file__).resolve().parents[1]


def switches_in_readme() -> set[str]:
    text = (PROJECT / "README.md").read_text()
    return set(re.findall(r"^\| `(VA_[A-Z0-9_]+)` \|", text, flags=re.M))


def test_the_sources_have_switches() -> None:
    assert "VA_WS_BLOCK_N" in source_switches()


def test_every_switch_is_documented_and_every_documented_switch_exists() -> None:
    sources, readme = source_switches(), switches_in_readme()
    assert sources - readme == set(), f"switches missing from the README's table: {sorted(sources - readme)}"
    assert readme - sources == set(), (
        f"README lists switches the sources no longer read: {sorted(readme - sources)}"
    )


def test_every_switch_a_test_builds_with_is_one_the_sources_read() -> None:
    """The GPU tests that build with a switch (a flagged build: the sanitizer's uniform barriers,
    the plan-order test's late plan) test nothing if the sources no longer read it."""
    used = set()
    for path in (PROJECT / "tests").glob("test_*.py"):
        text = path.read_text()
        if "flagged_build" in text:  # the tests that build the extension with flags of their own
            used |= set(re.findall(r"-D(VA_[A-Z0-9_]+)", text))
    assert {"VA_UNIFORM_GROUP_BARRIERS", "VA_DELAY_PLAN_PUBLISH_NS"} <= used
    assert used - source_switches() == set(), (
        f"tests build with switches the sources do not read: {sorted(used - source_switches())}"
    )
