"""Report folders named in the project's documents resolve: in the tree, or moved out of it.

`reports/README.md` indexes every committed run. Folders whose findings `kernel/NOTES.md` carries
may be taken out of the tracked tree to keep it under its 32 MB (tests/test_tree_size.py); they
are then listed under "Moved out of the tree", in batches: each batch a `git archive <commit>`
command naming the last commit that holds its folders, then a fenced list of them. These tests
keep that section honest: a name a document gives in full must be a folder of the tree or a listed
one, a listed one must be gone from the tree and listed once, and its batch's commit must hold it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
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
# The section runs to the next second-level heading or the end of the file.
_MOVED = re.compile(r"^## Moved out of the tree\n(?P<body>.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)
_LIST = re.compile(r"^```\n(?P<names>.*?)^```$", re.MULTILINE | re.DOTALL)
_COMMIT = re.compile(r"git archive ([0-9a-f]{7,40}) reports/<folder>")


def full_names(text: str) -> set[str]:
    """Every report folder ``text`` names in full (``reports/<time>-...-<sha>``)."""
    return {m.group(1) for m in _FULL_NAME.finditer(text) if "..." not in m.group(1)}


def moved_batches(index_text: str) -> list[tuple[str, list[str]]]:
    """(the commit that holds them, the folder names) of each batch of the index's "Moved out of the tree".

    A batch is a fenced list of folder names; the text between it and the list before it (or the
    heading) must hold exactly one `git archive <commit> reports/<folder>` command.
    """
    m = _MOVED.search(index_text)
    if m is None:
        raise ValueError('reports/README.md has no "## Moved out of the tree" section')
    body = m.group("body")
    batches = []
    start = 0
    for number, fenced in enumerate(_LIST.finditer(body), start=1):
        commits = _COMMIT.findall(body[start : fenced.start()])
        if len(commits) != 1:
            found = "no" if not commits else f"{len(commits)}"
            raise ValueError(
                f'"Moved out of the tree": batch {number} has {found} `git archive <commit> reports/<folder>` '
                "commands before its list; it needs one"
            )
        names = [line.strip() for line in fenced.group("names").splitlines() if line.strip()]
        batches.append((commits[0], names))
        start = fenced.end()
    if not batches:
        raise ValueError('"Moved out of the tree" holds no fenced list of folders')
    return batches


def listed_twice(batches: list[tuple[str, list[str]]]) -> list[str]:
    """The folder names listed more than once, within one batch or across batches."""
    counts = Counter(name for _, names in batches for name in names)
    return sorted(name for name, count in counts.items() if count > 1)


def unresolved(named: set[str], in_tree: set[str], moved: set[str]) -> list[str]:
    return sorted(n for n in named if n not in in_tree and n not in moved)


def _tree_folders() -> set[str]:
    return {p.name for p in REPORTS.iterdir() if p.is_dir()}


def test_every_folder_named_in_full_is_in_the_tree_or_moved() -> None:
    moved = {name for _, names in moved_batches(INDEX.read_text(encoding="utf-8")) for name in names}
    in_tree = _tree_folders()
    missing = {}
    for doc in DOCUMENTS:
        names = unresolved(full_names((ROOT / doc).read_text(encoding="utf-8")), in_tree, moved)
        if names:
            missing[doc] = names
    assert not missing, f"report folders named but neither in reports/ nor moved out: {missing}"


def test_the_moved_folders_are_out_of_the_tree_and_indexed() -> None:
    text = INDEX.read_text(encoding="utf-8")
    batches = moved_batches(text)
    empty = [commit for commit, names in batches if not names]
    assert not empty, f"moved batches with an empty list (their commits): {empty}"
    twice = listed_twice(batches)
    assert not twice, f"folders listed as moved more than once: {twice}"
    moved = [name for _, names in batches for name in names]
    back = sorted(set(moved) & _tree_folders())
    assert not back, (
        f"folders listed as moved are in reports/ again: {back}; read them from outside the checkout "
        "(reports/README.md, 'Moved out of the tree'), or drop them from the list if they are back for good"
    )
    table = text[: text.index("## Moved out of the tree")]
    unindexed = [n for n in moved if n not in full_names(table)]
    assert not unindexed, f"moved folders without their row in the index: {unindexed}"


def test_each_batch_commit_holds_its_moved_folders() -> None:
    batches = moved_batches(INDEX.read_text(encoding="utf-8"))
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    absent = {}
    not_in_clone = []
    for commit, moved in batches:
        has_commit = subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
        ).returncode
        if has_commit != 0:
            not_in_clone.append(commit)
            continue
        listing = subprocess.run(
            ["git", "ls-tree", "-d", "--name-only", commit, "reports/"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        held = {Path(p).name for p in listing}
        missing = [n for n in moved if n not in held]
        if missing:
            absent[commit] = missing
    assert not absent, f"these batches' commits do not hold their moved folders: {absent}"
    if not_in_clone:
        pytest.skip(f"commits {not_in_clone} are not in this clone (a shallow clone or an archive)")


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
    assert moved_batches(text) == [("abcdef1", ["20990101T000000-trials-nvidia-h200-abcdef1"])]
    moved = {"20990101T000000-trials-nvidia-h200-abcdef1"}
    assert unresolved(full_names(text), set(), moved) == [
        "20990101T000001-sweep-default-nvidia-h200-abcdef1-dirty"
    ]
    assert (
        unresolved(full_names(text), {"20990101T000001-sweep-default-nvidia-h200-abcdef1-dirty"}, moved) == []
    )
    with pytest.raises(ValueError, match="batch 1 has no `git archive"):
        moved_batches(text.replace("git archive abcdef1", "git show abcdef1"))
    with pytest.raises(ValueError, match="Moved out of the tree"):
        moved_batches(text.replace("## Moved out", "## Moved"))
    with pytest.raises(ValueError, match="no fenced list"):
        moved_batches(text.replace("```", "~~~"))

    # A second batch, with its own commit; a section after it ends the moved one.
    second = (
        "\n### Second batch: whole in commit 1234567\n\n"
        "    git archive 1234567 reports/<folder> | tar -x -C DIR\n\n"
        "```\n20990102T000000-ab-x-nvidia-h200-1234567-vs-1234567\n20990102T000100-ncu-nvidia-h200-1234567\n```\n"
    )
    two = text + second + "\n## After\n\n```\nnot-a-moved-folder\n```\n"
    assert moved_batches(two) == [
        ("abcdef1", ["20990101T000000-trials-nvidia-h200-abcdef1"]),
        (
            "1234567",
            [
                "20990102T000000-ab-x-nvidia-h200-1234567-vs-1234567",
                "20990102T000100-ncu-nvidia-h200-1234567",
            ],
        ),
    ]
    assert listed_twice(moved_batches(two)) == []
    # The first batch's command does not stand in for a second batch that lacks its own.
    with pytest.raises(ValueError, match="batch 2 has no `git archive"):
        moved_batches(two.replace("git archive 1234567", "git show 1234567"))
    with pytest.raises(ValueError, match="batch 2 has 2 `git archive"):
        moved_batches(two.replace("### Second batch", "    git archive 7654321 reports/<folder>\n### Second"))
    again = two.replace(
        "20990102T000100-ncu-nvidia-h200-1234567", "20990101T000000-trials-nvidia-h200-abcdef1"
    )
    assert listed_twice(moved_batches(again)) == ["20990101T000000-trials-nvidia-h200-abcdef1"]
