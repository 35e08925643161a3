"""The tree that travels to the GPU box stays under 32 MB (DESIGN.md section 3).

Every device run copies the files git tracks, and the untracked ones it does not ignore, to the
GPU box; committed reports and bundles are what grows it. The limit is checked here so that a
report run that would push the tree over it fails CI instead of landing. (The bundles' own
budgets, <= 16 MB each and <= 24 MB together, are in test_bundles.py.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE_LIMIT_BYTES = 32 * 10**6  # decimal MB, as the bundles' budgets
SHOW_LARGEST = 10


def files_that_travel(root: Path) -> list[tuple[str, int]]:
    """(path, bytes) of every file git tracks or would track under ``root``, as in the working tree.

    A tracked file deleted in the working tree does not travel and is left out.
    """
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    sizes = {}
    for name in listing.decode().split("\0"):
        path = root / name
        if name and path.is_file():
            sizes[name] = path.stat().st_size
    return sorted(sizes.items(), key=lambda item: (-item[1], item[0]))


def over_limit(files: list[tuple[str, int]], limit: int = TREE_LIMIT_BYTES) -> str | None:
    """None when the files fit the limit, else a message with the total and the largest files."""
    total = sum(size for _, size in files)
    if total <= limit:
        return None
    largest = sorted(files, key=lambda item: -item[1])[:SHOW_LARGEST]
    lines = [
        f"the tree that travels to the GPU box holds {total:,} bytes, over the {limit:,}-byte limit "
        f"(DESIGN.md section 3) by {total - limit:,}; largest files:",
        *(f"  {size:>12,}  {name}" for name, size in largest),
        "`python -m harness report --prune reports/` compresses older runs' results and drops "
        "their HTML; large trial files belong outside the tree.",
    ]
    return "\n".join(lines)


def test_the_tree_that_travels_stays_under_the_limit() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tree is what git tracks")
    inside = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True
    )
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout: the tree is what git tracks")
    files = files_that_travel(ROOT)
    assert any(name == "README.md" for name, _ in files), "git lists none of the project's files"
    message = over_limit(files)
    assert message is None, message


def test_the_check_fails_a_tree_over_the_limit() -> None:
    files = [("bundles/a.pt", 20 * 10**6), ("reports/run/index.html", 12 * 10**6 + 1), ("README.md", 10)]
    message = over_limit(files)
    assert message is not None
    assert "32,000,011 bytes" in message and "by 11" in message
    assert message.index("bundles/a.pt") < message.index("reports/run/index.html")
    assert over_limit(files[:1]) is None
    assert over_limit([("x", TREE_LIMIT_BYTES)]) is None


def test_the_listing_counts_untracked_files_but_not_ignored_or_deleted_ones(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("build/\n")
    (tmp_path / "kept.txt").write_bytes(b"x" * 100)
    (tmp_path / "gone.txt").write_bytes(b"y" * 50)
    git("add", ".gitignore", "kept.txt", "gone.txt")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "new.txt").write_bytes(b"z" * 7)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "big.bin").write_bytes(b"b" * 1000)
    assert files_that_travel(tmp_path) == [("kept.txt", 100), (".gitignore", 7), ("new.txt", 7)]
