"""``python -m harness <command>``: one entry point; each command lives in its own module.

Each module listed in ``COMMANDS`` defines ``register_cli(subparsers)``, which adds its
parser and sets ``func`` to a callable taking the parsed namespace and returning an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

COMMANDS = (
    "harness.bundles",
    "harness.parity",
    "harness.sweep",
    "harness.report",
    "harness.compare",
    "harness.ab",
    "harness.mma_peak",
    "harness.bringup",
)


def shown(path: Path | str) -> Path:
    """``path`` as a command prints it: relative to the repository root when inside it (so logs
    and records name ``reports/...``, not the machine's checkout), else as given."""
    with contextlib.suppress(ValueError):
        return Path(path).resolve().relative_to(REPO_ROOT)
    return Path(path)


def positive_number(what: str) -> Callable[[str], float]:
    """An argparse ``type``: a number > 0, its error naming the unit (``what``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number of {what}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
