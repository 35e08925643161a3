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
