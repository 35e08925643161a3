"""A box measurement's record: the checks before it runs and the writing after, shared by the
commands that measure the box rather than the kernel (``mma-peak``, ``nvml-lag``). Each writes
one JSON file into ``--out`` (default ``reports/<UTC time>-<command>-<gpu>-<sha7>/``), or into
a bring-up's folder as one of its steps."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# A bring-up's folder (its record beside): its box steps may run again there, and replace the
# step's record as a bring-up rerun replaces every step it runs (harness/bringup.py).
BRINGUP_RECORD = "bringup.json"


def check_no_record(out: str | None, name: str) -> None:
    """An ``--out`` that already holds a record ``name`` is refused (ValueError): this run would
    replace it. A bring-up's folder is the exception (its rerun replaces its steps' records)."""
    if not out or not Path(out).is_dir():
        return
    held = Path(out) / name
    if (held.exists() or held.is_symlink()) and not (Path(out) / BRINGUP_RECORD).is_file():
        raise ValueError(
            f"--out {out} already holds {name}, which this run would replace; expected a "
            "new folder: pick another"
        )


def refused(command: str, out: str | None, name: str) -> bool:
    """Before anything runs: a GPU torch can see, and an ``--out`` that may take the record
    (:func:`harness.cli.check_run_out_dir`, :func:`check_no_record`). True, after an error
    line naming ``command``, when the command should exit 2."""
    import torch

    from harness.cli import check_run_out_dir
    from harness.results import REPORTS_DIR

    if not torch.cuda.is_available():
        print(f"error: {command}: no CUDA device is visible to torch", file=sys.stderr)
        return True
    try:
        check_run_out_dir(out, REPORTS_DIR)
        check_no_record(out, name)
    except ValueError as e:  # before the run, so that a bad --out costs none of it
        print(f"error: {command}: {e}", file=sys.stderr)
        return True
    return False


def write(
    command: str, out: str | None, name: str, head: tuple[str, int], device: Any, body: dict[str, Any]
) -> Path | None:
    """The record (``head``: its schema and version; the time, the command line, the commit and
    the environment of ``device``; then ``body``) written atomically to ``out``'s ``name``, or
    to a new run folder named after ``command`` and the GPU. The file's path, or None after an
    error line (where it is kept instead, if anywhere: :func:`harness.results.write_or_keep`)."""
    from harness.env import environment, git_info
    from harness.results import run_folder, write_or_keep

    git = git_info()
    now = datetime.now(timezone.utc)
    env = environment(device)
    folder = (
        Path(out) if out else run_folder(command, (env.get("gpu") or {}).get("name"), git.get("sha"), now)
    )
    record = {
        "schema": head[0],
        "schema_version": head[1],
        "created_utc": now.isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, "-m", "harness", *sys.argv[1:]]),
        "git": git,
        "environment": env,
        **body,
    }
    failed = write_or_keep(folder / name, json.dumps(record, indent=1) + "\n")
    if failed:  # the folder was checked before the run; it may have filled up since
        print(f"error: {failed}", file=sys.stderr)
        return None
    return folder / name
