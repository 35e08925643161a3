"""The extension built with extra nvcc flags, for GPU tests that run a workload on such a build in
a process of their own (the flags are part of the build's hash, kernel/build.py, so the build
does not replace the default one). Not collected by pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def env_with_cuda_flags(flags: str) -> dict[str, str]:
    """This process's environment with ``flags`` added to the extension's nvcc flags."""
    env = dict(os.environ)
    if flags:
        env["VERIFY_ATTN_EXTRA_CUDA_FLAGS"] = f"{env.get('VERIFY_ATTN_EXTRA_CUDA_FLAGS', '')} {flags}".strip()
    return env


def build_with_flags(flags: str, timeout_s: float = 900, archs: str | None = None) -> dict[str, str]:
    """Build the extension with ``flags`` (in a subprocess, before any tool runs the workload) and
    return the environment that loads that build; AssertionError with the build's log if it fails.
    ``archs`` sets ``VERIFY_ATTN_ARCHS`` for that build (kernel/build.py)."""
    env = env_with_cuda_flags(flags)
    if archs is not None:
        env["VERIFY_ATTN_ARCHS"] = archs
    res = subprocess.run(
        [sys.executable, "-c", "import kernel; kernel.load_extension()"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=ROOT,
    )
    assert res.returncode == 0, f"the build with {flags} failed:\n{(res.stdout + res.stderr)[-4000:]}"
    return env


def run_on_build(
    flags: str, args: list[str], archs: str | None = None, timeout_s: float = 600
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Build with ``flags`` (build_with_flags), then run ``python *args`` from the project root on
    that build; the finished process and the last 4000 characters of its output."""
    env = build_with_flags(flags, archs=archs)
    res = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT
    )
    return res, (res.stdout + res.stderr)[-4000:]
