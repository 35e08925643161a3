"""compute-sanitizer memcheck and racecheck on a small bundle and small random batches
(tests/gpu_sanitizer_target.py).

The workload `long` (one request whose CTAs each run ~95 KV tiles, laid out for one SM) runs
clean under memcheck, and under racecheck in every config but `small` and `small-m32` as built.
There racecheck reports WAR hazards between the mma.sync loop's PV reads of a KV stage
(`ldmatrix .trans`) and the `cp.async` gather that refills it after the next tile's CTA barrier,
an order the code does not have. The report follows the row groups' named barriers: a group of
four warps whose softmax reference moves runs two more barriers of its own on that tile, so over
a long call the groups pass different numbers of them, and racecheck then takes a read before a
`__syncthreads` and a write after it, by warps of different groups, for unordered. A stand-alone
loop with the kernel's order shows the same report when one group runs extra named barriers and
none when every group runs the same, and reports a real WAR (the gather moved before the barrier)
at any length; the kernel built with `VA_UNIFORM_GROUP_BARRIERS` (two group barriers more in the
other branch: every group the same count) runs clean (kernel/NOTES.md, "racecheck's report
against a loop outside the kernel"). So:
- `racecheck-long-small`: the shipped build, an expected failure (xfail, never counted as passed;
  an XPASS says this racecheck no longer reports the drift);
- `racecheck-long-small-uniform`: the same calls on the build with uniform group barriers, which
  must be clean: the long calls' check of everything else in those two configs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from flagged_build import ROOT, build_with_flags

pytestmark = pytest.mark.gpu

TARGET = ROOT / "tests" / "gpu_sanitizer_target.py"
# Each tool's clean summary line (racecheck reports hazards, not an "ERROR SUMMARY").
CLEAN = {
    "memcheck": "ERROR SUMMARY: 0 errors",
    "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)",
}
LONG_RACECHECK = (
    "racecheck reports WAR hazards on the shipped build's long unsplit calls in these configs, once "
    "the row groups' counts of named barriers drift apart; the code has no such order (this module's "
    "docstring; kernel/NOTES.md)"
)
# The configs whose long unsplit calls racecheck reports on (mma.sync with a row group of four
# warps: sm_120's two shapes).
REPORTED = "small,small-m32"
# The build for the race checker with every row group passing the same named barriers.
UNIFORM = "-DVA_UNIFORM_GROUP_BARRIERS"
RUNS = (
    pytest.param("memcheck", "all", None, "", id="memcheck-all"),
    pytest.param("racecheck", "default", None, "", id="racecheck-default"),
    pytest.param("racecheck", "long", f"except:{REPORTED}", "", id="racecheck-long"),
    pytest.param(
        "racecheck",
        "long",
        f"only:{REPORTED}",
        "",
        id="racecheck-long-small",
        marks=pytest.mark.xfail(reason=LONG_RACECHECK, strict=False),
    ),
    pytest.param("racecheck", "long", f"only:{REPORTED}", UNIFORM, id="racecheck-long-small-uniform"),
)


@pytest.mark.parametrize("tool,workload,configs,flags", RUNS)
def test_compute_sanitizer_is_clean(tool: str, workload: str, configs: str | None, flags: str) -> None:
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on the PATH")
    env = build_with_flags(flags) if flags else None  # that build first, outside the tool
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
        env=env,
    )
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, f"compute-sanitizer {tool} ({workload}) exit {res.returncode}:\n{tail}"
    assert CLEAN[tool] in res.stdout + res.stderr, tail
    assert f"sanitizer workload {workload} done" in res.stdout, tail
