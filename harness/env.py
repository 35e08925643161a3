"""Where a run happened: git state, GPU, software versions, kernel build (results.json's
``git`` and ``environment``). One module, so parity, sweep and A/B runs record the same fields."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from harness import nvml
from harness.timing import l2_bytes_of

REPO_ROOT = Path(__file__).resolve().parent.parent


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_GIT_ERRORS: list[str] = []  # what git said when it failed, for the record's ``git_error``


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        _GIT_ERRORS.append(f"git {args[0]}: {type(e).__name__}: {e}")
        return None
    if done.returncode != 0:
        _GIT_ERRORS.append(
            f"git {args[0]}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        )
        return None
    return done.stdout.strip()


def _own_work_tree() -> bool:
    """Whether git's work tree here is this checkout's own, not a repository around a source
    copy of it (a copy of the tree placed inside another project's checkout)."""
    top = _git("rev-parse", "--show-toplevel")
    return top is not None and Path(top).resolve() == REPO_ROOT


def git_info() -> dict[str, Any]:
    """{sha, dirty, describe} of the checkout; dirty counts changes to tracked files only, so the
    reports a run writes do not make the next run dirty.

    A source copy without ``.git`` (a tarball, a CI artifact, a GPU box fed a copy of the tree)
    can name its commit through ``VERIFY_ATTN_GIT_SHA`` and ``VERIFY_ATTN_GIT_DIRTY`` (0/1);
    git's own answer wins where this checkout is a work tree's root (a copy inside another
    project's repository gets that repository's answer from git, which is not its commit), and the
    record says where the sha came from. Where git failed for another reason than there being no
    repository (a checkout of another owner: "dubious ownership"), ``git_error`` says what it said.
    """
    _GIT_ERRORS.clear()
    sha = _git("rev-parse", "HEAD") if _own_work_tree() else None
    if sha is not None:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return {
            "sha": sha,
            "dirty": None if status is None else bool(status),
            "describe": _git("describe", "--always", "--dirty"),
            "source": "git",
        }
    env_sha = os.environ.get("VERIFY_ATTN_GIT_SHA") or None
    env_dirty = os.environ.get("VERIFY_ATTN_GIT_DIRTY")
    out = {
        "sha": env_sha,
        "dirty": None if env_dirty is None else env_dirty not in ("0", "", "false"),
        "describe": None,
        "source": "env" if env_sha else None,
    }
    errors = [e for e in _GIT_ERRORS if "not a git repository" not in e]
    if errors and not env_sha:
        out["git_error"] = errors[0]
        print(f"warning: the run's commit is unknown: {errors[0]}", file=sys.stderr)
    return out


def _build_flags(device: torch.device) -> dict[str, Any] | None:
    """What the kernel extension says about its build (``build_info()``) and the archs and
    flags it was compiled with, where the kernel package exposes them. Recording a run's
    environment never builds the kernel: a run that did not use it (``--impls oracle``) says so."""
    if device.type != "cuda":
        return None
    try:
        import kernel

        flags: dict[str, Any] = {}
        ext = kernel.build.loaded_extension()
        if ext is None:
            return {"build_info": "the kernel extension was not loaded in this run"}
        info = getattr(ext, "build_info", None)
        if info is not None:
            value = info()
            flags.update(value if isinstance(value, dict) else {"build_info": str(value)})
        built = getattr(kernel.build, "loaded_build", None)
        if callable(built):
            flags.update(built() or {})
        return flags or None
    except Exception as e:  # the kernel's own row says why it is unavailable; here it is context
        return {"error": f"{type(e).__name__}: {e}"}


def environment(device: torch.device) -> dict[str, Any]:
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        snap, reason = nvml.snapshot(device)
        gpu = {
            "name": props.name,
            "uuid": snap["uuid"] if snap else str(getattr(props, "uuid", "")),
            "cc": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "l2_bytes": l2_bytes_of(device),
            "driver": snap["driver"] if snap else None,
            "clocks": {k: snap[k] for k in snap if k.endswith("_mhz")} if snap else None,
            "power_limit_w": snap["power_limit_w"] if snap else None,
            "nvml": "" if snap else reason,
        }
    return {
        "gpu": gpu,
        "device": str(device),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "sglang": _version("sglang"),
        "build_flags": _build_flags(device),
    }
