"""compute-sanitizer memcheck and racecheck on a small bundle and small random batches
(tests/gpu_sanitizer_target.py).

The workload `long` (one request whose CTAs each run ~95 KV tiles, laid out for one SM) runs
clean under memcheck, and under racecheck in every config but `small` and `small-m32`. In those
two it is an expected failure under racecheck (xfail, not counted as passed): racecheck reports WAR hazards between the mma.sync loop's PV reads of a KV stage (`ldmatrix
.trans`) and the `cp.async` gather that refills the stage two tiles later, in `small` and
`small-m32` once a CTA runs more than ~60 tiles (none at 13-51 tiles; 4, 6, 45,064 and then 5
errors on runs of 63, 76 and twice 95 tiles; `large`, whose loop has the same stages and
barrier, none up to 282 tiles). The machine code does not allow that order: every warp consumes
those reads (the `HMMA` that takes their registers) before the loop's back edge, and the gather
is issued only after the next tile's CTA barrier (`DEPBAR`, `BAR.SYNC 0`, then `LDGSTS`).
synccheck is clean, 400 calls of the same call agree to the bit and with the fp64 oracle, the
report stays with racecheck's tracking of asynchronous copies off and with the row groups'
barriers as immediates, and goes with a second CTA barrier right after PV (trial builds, not
kept). kernel/NOTES.md ("racecheck on long unsplit mma.sync calls") has the runs.
"""

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
LONG_RACECHECK = (
    "racecheck reports WAR hazards on the mma.sync loop's long unsplit calls that its machine code "
    "does not allow (this module's docstring; kernel/NOTES.md)"
)
# The configs whose long unsplit calls racecheck reports on (mma.sync with a row group of four
# warps: sm_120's two shapes).
REPORTED = "small,small-m32"
RUNS = (
    pytest.param("memcheck", "all", None, id="memcheck-all"),
    pytest.param("racecheck", "default", None, id="racecheck-default"),
    pytest.param("racecheck", "long", f"except:{REPORTED}", id="racecheck-long"),
    pytest.param(
        "racecheck",
        "long",
        f"only:{REPORTED}",
        id="racecheck-long-small",
        marks=pytest.mark.xfail(reason=LONG_RACECHECK, strict=False),
    ),
)


@pytest.mark.parametrize("tool,workload,configs", RUNS)
def test_compute_sanitizer_is_clean(tool: str, workload: str, configs: str | None) -> None:
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on the PATH")
    res = subprocess.run(
        [
            exe,
            "--tool",
            tool,
            "--error-exitcode",
            "3",
            sys.executable,
            str(TARGET),
            workload,
            *([configs] if configs else []),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, f"compute-sanitizer {tool} ({workload}) exit {res.returncode}:\n{tail}"
    assert CLEAN[tool] in res.stdout + res.stderr, tail
    assert f"sanitizer workload {workload} done" in res.stdout, tail
