"""Report folders named in the project's documents resolve: in the tree, or moved out of it.

`reports/README.md` indexes every committed run. Folders whose findings `kernel/NOTES.md` carries
may be taken out of the tracked tree to keep it under its 32 MB (tests/test_tree_size.py); they
are then listed under "Moved out of the tree" with the last commit that holds them. These tests
keep that list honest: a name a document gives in full must be a folder of the tree or a listed
one, a listed one must be gone from the tree, and that commit must hold it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
INDEX = REPORTS / "README.md"
# The documents whose references a reader follows from the tree.
DOCUMENTS = ("README.md", "reports/README.md", "reports/waivers.toml", "kernel/NOTES.md", "harness/SGLANG.md")

# A run folder's full name: time, kind and labels, the commit (7 hex digits), maybe "-dirty".
# Abbreviated references ("...082755-parity-...") are not checked.
_FULL_NAME = re.compile(r"reports/(\d{8}T\d{6}-[A-Za-z0-9_.-]*?-[0-9a-f]{7}(?:-dirty)?)(?=[/`'\"\s,;)]|$)")
_MOVED = re.compile(
    r"^## Moved out of the tree\n(?P<text>.*?)^```\n(?P<names>.*?)^```$", re.MULTILINE | re.DOTALL
)
_COMMIT = re.compile(r"git archive ([0-9a-f]{7,40}) reports/<folder>")


def full_names(text: str) -> set[str]:
    """Every report folder ``text`` names in full (``reports/<time>-...-<sha>``)."""
    return {m.group(1) for m in _FULL_NAME.finditer(text) if "..." not in m.group(1)}


def moved_section(index_text: str) -> tuple[str, list[str]]:
    """(the commit that holds them, the folder names) of the index's "Moved out of the tree"."""
    m = _MOVED.search(index_text)
    if m is None:
        raise ValueError('reports/README.md has no "## Moved out of the tree" section with a fenced list')
    commit = _COMMIT.search(m.group("text"))
    if commit is None:
        raise ValueError('"Moved out of the tree" names no `git archive <commit> reports/<folder>` command')
    names = [line.strip() for line in m.group("names").splitlines() if line.strip()]
    return commit.group(1), names


def unresolved(named: set[str], in_tree: set[str], moved: set[str]) -> list[str]:
    return sorted(n for n in named if n not in in_tree and n not in moved)


def _tree_folders() -> set[str]:
    return {p.name for p in REPORTS.iterdir() if p.is_dir()}


def test_every_folder_named_in_full_is_in_the_tree_or_moved() -> None:
    _, moved = moved_section(INDEX.read_text(encoding="utf-8"))
    in_tree = _tree_folders()
    missing = {}
    for doc in DOCUMENTS:
        names = unresolved(full_names((ROOT / doc).read_text(encoding="utf-8")), in_tree, set(moved))
        if names:
            missing[doc] = names
    assert not missing, f"report folders named but neither in reports/ nor moved out: {missing}"


def test_the_moved_folders_are_out_of_the_tree_and_indexed() -> None:
    text = INDEX.read_text(encoding="utf-8")
    _, moved = moved_section(text)
    assert moved and len(moved) == len(set(moved)), "the moved list is empty or names a folder twice"
    back = sorted(set(moved) & _tree_folders())
    assert not back, (
        f"folders listed as moved are in reports/ again: {back}; read them from outside the checkout "
        "(reports/README.md, 'Moved out of the tree'), or drop them from the list if they are back for good"
    )
    table = text[: text.index("## Moved out of the tree")]
    unindexed = [n for n in moved if n not in full_names(table)]
    assert not unindexed, f"moved folders without their row in the index: {unindexed}"


def test_the_named_commit_holds_each_moved_folder() -> None:
    commit, moved = moved_section(INDEX.read_text(encoding="utf-8"))
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    has_commit = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    ).returncode
    if has_commit != 0:
        pytest.skip(f"commit {commit} is not in this clone (a shallow clone or an archive)")
    listing = subprocess.run(
        ["git", "ls-tree", "-d", "--name-only", commit, "reports/"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    held = {Path(p).name for p in listing}
    absent = [n for n in moved if n not in held]
    assert not absent, f"commit {commit} does not hold these moved folders: {absent}"


def test_the_checks_can_fail() -> None:
    text = (
        "| `reports/20990101T000000-trials-nvidia-h200-abcdef1/` | x |\n"
        "| `reports/20990101T000001-sweep-default-nvidia-h200-abcdef1-dirty/` | y |\n"
        "a short one: `...000002-parity-...`, and `reports/20990101T000003-parity-...-abcdef1/`\n\n"
        "## Moved out of the tree\n\nwhole in\n\n    git archive abcdef1 reports/<folder> | tar -x -C DIR\n\n"
        "```\n20990101T000000-trials-nvidia-h200-abcdef1\n```\n"
    )
    assert full_names(text) == {
        "20990101T000000-trials-nvidia-h200-abcdef1",
        "20990101T000001-sweep-default-nvidia-h200-abcdef1-dirty",
    }
    commit, moved = moved_section(text)
    assert commit == "abcdef1" and moved == ["20990101T000000-trials-nvidia-h200-abcdef1"]
    assert unresolved(full_names(text), set(), set(moved)) == [
        "20990101T000001-sweep-default-nvidia-h200-abcdef1-dirty"
    ]
    assert (
        unresolved(full_names(text), {"20990101T000001-sweep-default-nvidia-h200-abcdef1-dirty"}, set(moved))
        == []
    )
    with pytest.raises(ValueError, match="no `git archive"):
        moved_section(text.replace("git archive abcdef1", "git show abcdef1"))
    with pytest.raises(ValueError, match="Moved out of the tree"):
        moved_section(text.replace("## Moved out", "## Moved"))
