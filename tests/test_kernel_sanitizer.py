"""compute-sanitizer memcheck and racecheck on a small bundle and a small random batch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

TARGET = Path(__file__).resolve().parent / "gpu_sanitizer_target.py"
# Each tool's clean summary line (racecheck reports hazards, not an "ERROR SUMMARY").
CLEAN = {
    "memcheck": "ERROR SUMMARY: 0 errors",
    "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)",
}


@pytest.mark.parametrize("tool", sorted(CLEAN))
def test_compute_sanitizer_is_clean(tool: str) -> None:
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on the PATH")
    res = subprocess.run(
        [exe, "--tool", tool, "--error-exitcode", "3", sys.executable, str(TARGET)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, f"compute-sanitizer {tool} exit {res.returncode}:\n{tail}"
    assert CLEAN[tool] in res.stdout + res.stderr, tail
