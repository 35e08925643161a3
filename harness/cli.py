"""``python -m harness <command>``: one entry point; each command lives in its own module.

Each module listed in ``COMMANDS`` defines ``register_cli(subparsers)``, which adds its
parser and sets ``func`` to a callable taking the parsed namespace and returning an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.results import RESULTS_FILE, RESULTS_GZ

REPO_ROOT = Path(__file__).resolve().parent.parent

COMMANDS = (
    "harness.bundles",
    "harness.parity",
    "harness.sweep",
    "harness.report",
    "harness.compare",
    "harness.ab",
    "harness.mma_peak",
    "harness.nvml_lag",
    "harness.bringup",
)


def from_checkout(path: Path | str) -> Path:
    """``path`` as the commands a run starts from the repository root take it, and as records
    keep it: relative to the root when inside it (``reports/...``, not the machine's checkout),
    else in full."""
    resolved = Path(path).resolve()
    with contextlib.suppress(ValueError):
        return resolved.relative_to(REPO_ROOT.resolve())
    return resolved


def shown(path: Path | str) -> Path:
    """``path`` as a command prints it, a path that works from where the command ran: relative
    to the current folder when inside it (from the repository root, ``reports/...``), else in
    full. What a child started from the root reads, or a record keeps: :func:`from_checkout`."""
    resolved = Path(path).resolve()
    with contextlib.suppress(ValueError, OSError):
        return resolved.relative_to(Path.cwd().resolve())
    return resolved


def nonempty_path(what: str) -> Callable[[str], Path]:
    """An argparse ``type`` for a path to write to (an ``--out`` folder, an ``--html`` file): an
    empty value (which Path reads as the current folder) is refused, the error saying ``what`` was
    expected."""

    def parse(text: str) -> Path:
        if not text:
            raise argparse.ArgumentTypeError(f"expected {what}, got ''")
        return Path(text)

    return parse


def positive_number(what: str) -> Callable[[str], float]:
    """An argparse ``type``: a finite number > 0, its error naming the unit (``what``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > 0:  # nan too
            raise argparse.ArgumentTypeError(f"expected a positive number of {what}, got {text!r}")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number of {what}, got {text!r}")
        return value

    return parse


def check_out_dir(path: Path | str, option: str = "--out") -> Path:
    """``path`` as the folder a command will write its results into, checked before the command's
    work so that a bad ``option`` fails at once rather than when the results are written: created
    if missing and probed with a file written and removed; the folders the probe created are
    removed again (writing the results creates them), so a command that stops before writing
    leaves nothing. Raises ValueError naming ``option``; returns ``path``."""
    if not str(path):  # Path("") is the current folder: an empty value is a mistake, not a choice
        raise ValueError(f"{option} is empty; expected a folder to write into (created if missing)")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; expected a folder to write into (created if missing)")
    created = []
    missing = path
    while not missing.exists() and missing != missing.parent:
        created.append(missing)
        missing = missing.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(
            f"{option} {path}: cannot create or write a file there ({e.strerror or e}); expected a writable folder"
        ) from e
    finally:
        for folder in created:  # the deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
    return path


def held_results(folder: Path | str) -> Path | None:
    """The run results ``folder`` already holds (``results.json``, else ``results.json.gz``), or
    None."""
    for name in (RESULTS_FILE, RESULTS_GZ):
        found = Path(folder) / name
        if found.exists() or found.is_symlink():
            return found
    return None


def check_run_out_dir(out: Path | str | None, reports: Path) -> Path | None:
    """A run's ``--out`` checked by :func:`check_out_dir`, or without one the ``reports`` folder
    that its own run folder will be made in (the error then says there was no ``--out``). An
    ``--out`` that already holds a run's results is refused: writing there would replace them.
    Returns ``out`` as a Path, or None without one. Raises ValueError."""
    if out is not None:
        held = held_results(out) if str(out) and Path(out).is_dir() else None
        if held is not None:
            raise ValueError(
                f"--out {out} already holds a run ({held.name}), which this run would replace; "
                "expected a new folder: pick another"
            )
        if str(out) and (Path(out) / "index.html").exists():  # the run's page would go there
            raise ValueError(
                f"--out {out} already holds an index.html (a page of its own, or of a run cut short), "
                "which the run's page would replace; expected a new folder: pick another"
            )
        return check_out_dir(out)
    check_out_dir(reports, "no --out: the reports folder")
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with signals_as_interrupt():  # SIGTERM/SIGHUP clean up as Ctrl-C does
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (``| head``): say nothing more, and leave no traceback,
        # nor one from the interpreter's last flush of stdout at exit (the Python docs' recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[list[str]]:
    """SIGTERM and SIGHUP (nox or a job system stopping the run, a closed terminal) take the
    path of Ctrl-C: a KeyboardInterrupt in the main thread, so that what a command does on Ctrl-C
    (a bring-up stops its step and records where it stopped, a sharded sweep stops its workers,
    an A/B removes its worktree) happens for them too, instead of children left running. The list
    it yields names the signal received."""
    received: list[str] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield received
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
