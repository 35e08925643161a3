"""The few-row combine must read this call's split counts and first partial slots, however late
the main kernel's CTA 0 publishes them. Up to v77 it read them before its griddepcontrol.wait, so
every main kernel's CTA 0 had to write them before it let the combine launch; the `wgmma` kernel
let it launch at entry, and a combine block that started while CTA 0 planned read the previous
call's entries (under `pytest -n 8`, test_plans_of_other_sm_counts[84] failed with wrong rows
once and with an illegal address once). Since v78 it reads them after the wait (the order the
CUDA documents promise; `VA_PLAN_BEFORE_WAIT` builds v77's). tests/gpu_plan_order_target.py runs
every config on a build where CTA 0 publishes the plan 20 us late, so that a combine reading
stale entries would do so on every call, not once in a while (kernel/NOTES.md, "The wgmma kernel
let the combine read the previous call's plan", v78)."""

from __future__ import annotations

import pytest
from flagged_build import ROOT, run_on_build

pytestmark = pytest.mark.gpu

TARGET = ROOT / "tests" / "gpu_plan_order_target.py"
DELAY = "-DVA_DELAY_PLAN_PUBLISH_NS=20000"


def test_the_combine_reads_this_calls_plan() -> None:
    res, tail = run_on_build(DELAY, [str(TARGET)])
    assert res.returncode == 0, f"exit {res.returncode}:\n{tail}"
    assert "plan order workload done" in res.stdout and "; 0 calls wrong" in res.stdout, tail
