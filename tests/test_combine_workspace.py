"""The few-row combine must not let a partial slot this call did not write into any row, whatever
the workspace's block held before. tests/gpu_workspace_target.py runs the calls on a workspace
that held NaN and on one that held zeros; the default build must give the same bits on both, and
a build whose combine reads one slot past each request's splits (`VA_MUTATE_COMBINE_EXTRA_SPLIT`)
must not: the control that the workload reaches slots no item wrote (kernel/NOTES.md, v80-v81)."""

from __future__ import annotations

import re

import pytest
from flagged_build import ROOT, run_on_build

pytestmark = pytest.mark.gpu

TARGET = ROOT / "tests" / "gpu_workspace_target.py"


def run_target(flags: str) -> tuple[int, int, int, str]:
    res, tail = run_on_build(flags, [str(TARGET)])
    m = re.search(r"workspace workload done: .*; (\d+) of (\d+) calls wrong", res.stdout)
    assert m, f"exit {res.returncode}, no summary:\n{tail}"
    return res.returncode, int(m.group(1)), int(m.group(2)), tail


def test_slots_past_the_split_count_never_reach_a_row() -> None:
    rc, wrong, calls, tail = run_target("")
    assert rc == 0 and wrong == 0 and calls > 0, tail


def test_the_mutant_that_keeps_them_is_caught() -> None:
    rc, wrong, calls, tail = run_target("-DVA_MUTATE_COMBINE_EXTRA_SPLIT")
    assert rc == 1 and 0 < wrong <= calls, tail
