"""Since v79 the few-row combine derives its request's split count and first partial slot from
the call's inputs before its griddepcontrol.wait (batches of up to 32 requests), instead of
reading the entries the main kernel publishes. The two copies must agree on every config and SM
count: tests/gpu_combine_plan_target.py runs few-row batches on a build
(`VA_CHECK_COMBINE_PLAN`) whose combine writes NaN into any row whose derived entries differ from
the published ones, and must see no wrong call. The control: the same build with
`VA_MUTATE_COMBINE_PLAN`, whose derived entries leave a split request's last split out, must see
wrong calls, or the workload could not tell (kernel/NOTES.md v79)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from flagged_build import ROOT, build_with_flags

pytestmark = pytest.mark.gpu

TARGET = ROOT / "tests" / "gpu_combine_plan_target.py"
CHECK = "-DVA_CHECK_COMBINE_PLAN"
MUTANT = "-DVA_CHECK_COMBINE_PLAN -DVA_MUTATE_COMBINE_PLAN"


def run_workload(flags: str) -> tuple[int, int, str]:
    """(calls, wrong calls, output tail) of the workload on a build with ``flags``."""
    env = build_with_flags(flags)
    res = subprocess.run([sys.executable, str(TARGET)], capture_output=True, text=True, timeout=900, env=env)
    tail = (res.stdout + res.stderr)[-4000:]
    done = re.search(r"combine plan workload done: .*; (\d+) calls; (\d+) calls wrong", res.stdout)
    assert done is not None, f"the workload did not finish (exit {res.returncode}):\n{tail}"
    calls, wrong = int(done.group(1)), int(done.group(2))
    assert res.returncode == (1 if wrong else 0), f"exit {res.returncode} with {wrong} wrong:\n{tail}"
    return calls, wrong, tail


def test_the_combine_derives_the_plan_the_main_kernel_publishes() -> None:
    calls, wrong, tail = run_workload(CHECK)
    assert calls >= 100, tail
    assert wrong == 0, tail


def test_a_wrong_derived_plan_is_seen() -> None:
    calls, wrong, tail = run_workload(MUTANT)
    assert wrong > 0, f"the mutant's {calls} calls all passed:\n{tail}"
