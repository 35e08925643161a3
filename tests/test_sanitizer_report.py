"""The sanitizer test's reading of racecheck's report (tests/test_kernel_sanitizer.py,
``known_report``), on the report's own text: the shipped `small` builds' long calls may show only
WAR hazards between an ``ldmatrix .trans`` read and a ``cp.async`` write, anything else fails."""

from __future__ import annotations

import pytest
from test_kernel_sanitizer import known_report, races

# As racecheck printed it on the H200 (reports/20261201T020500-trials-nvidia-h200-e8249d2/).
KNOWN = """\
========= Error: Potential WAR hazard detected at __shared__ 0x7550 in block (2,0,0) :
=========     Read Thread (72,0,0) at va::ldmatrix_x4_trans(unsigned int (&)[4], const void *)+0x8800 in verify_attention.cuh:221
=========     Write Thread (192,0,0) at va::cp_async_16_evict_first(unsigned int, const void *, bool, unsigned long)+0x69a0 in verify_attention.cuh:205
=========     Current Value : 200, Incoming Value : 214
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= RACECHECK SUMMARY: 1 hazard displayed (5 errors, 0 warnings)
"""

# The same, as its default analysis printed it on the H200 (reports/20261201T062201-bringup-...).
KNOWN_ANALYSIS = """\
========= Error: Race reported between Write access at va::cp_async_16_evict_first(unsigned int, const void *, bool, unsigned long)+0x6f80 in verify_attention.cuh:205
=========     and Read access at va::ldmatrix_x4_trans(unsigned int (&)[4], const void *)+0x8c60 in verify_attention.cuh:221 [256 hazards]
=========     and Read access at va::ldmatrix_x4_trans(unsigned int (&)[4], const void *)+0x8d30 in verify_attention.cuh:221 [256 hazards]
=========
========= Error: Race reported between Write access at va::cp_async_16_evict_first(unsigned int, const void *, bool, unsigned long)+0x69c0 in verify_attention.cuh:205
=========     and Read access at va::ldmatrix_x4_trans(unsigned int (&)[4], const void *)+0x8800 in verify_attention.cuh:221 [128 hazards]
=========
sanitizer workload long done: small, small-m32
========= RACECHECK SUMMARY: 10 hazards displayed (10 errors, 0 warnings)
"""


def test_the_known_war_is_recognised() -> None:
    assert known_report(KNOWN) == ""
    assert known_report(KNOWN + KNOWN.replace("0x7550", "0x7560")) == ""


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (("WAR hazard", "RAW hazard"), "a RAW hazard"),
        (("va::ldmatrix_x4_trans", "va::ldmatrix_x4"), "a WAR hazard between Read in va::ldmatrix_x4"),
        (("va::cp_async_16_evict_first", "va::store_partial"), "Write in va::store_partial"),
        (("Read Thread", "Write Thread"), "a WAR hazard"),
    ],
)
def test_any_other_hazard_is_named(edit: tuple[str, str], said: str) -> None:
    assert said in known_report(KNOWN.replace(*edit))
    # one unknown hazard among known ones is enough
    assert said in known_report(KNOWN + KNOWN.replace(*edit))


def test_the_known_race_in_the_analysis_is_recognised() -> None:
    assert known_report(KNOWN_ANALYSIS) == ""
    assert len(races(KNOWN_ANALYSIS)) == 3


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            ("and Read access at va::ldmatrix_x4_trans", "and Read access at va::ldmatrix_x4"),
            "Read in va::ldmatrix_x4",
        ),
        (
            (
                "between Write access at va::cp_async_16_evict_first",
                "between Write access at va::store_partial",
            ),
            "Write in va::store_partial",
        ),
        (("and Read access", "and Write access"), "a race hazard between Write in"),
    ],
)
def test_any_other_race_in_the_analysis_is_named(edit: tuple[str, str], said: str) -> None:
    assert said in known_report(KNOWN_ANALYSIS.replace(*edit, 1))


def test_a_report_without_hazards_is_not_the_known_one() -> None:
    assert known_report("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n") != ""
