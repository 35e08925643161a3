"""`auto`'s per-call choice between `small` (M=48) and `small-m32` on parts that run the mma.sync
kernels in 99 KB (sm_120): the rule is host code (kernel/csrc/verify_attention.cuh,
prefer_small_m32), run here through the host program the ptxas check builds (nvcc, no GPU)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernel.ptxas_check import build_config_report

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")


@pytest.fixture(scope="module")
def report_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_config_report(tmp_path_factory.mktemp("rule"))


def choice(exe: Path, rows: int) -> str:
    res = subprocess.run([str(exe), "rule", str(rows)], capture_output=True, text=True, check=True)
    return res.stdout.strip()


# rows = tokens x heads -> the config `auto` takes. The H200 times of kernel/NOTES.md v24 (`small`
# against `small-m32`, config forced, one process) are the reason for each side of the line.
CASES = [
    (1, "small-m32"),
    (32, "small-m32"),  # one M=32 tile; M=48 would be a third padding
    (33, "small"),  # 2 M=32 tiles (64 rows) against one M=48 tile (48)
    (48, "small"),
    (64, "small-m32"),  # P=131k H=4 T=16: 140.5 against 181.6 us (M=48: 96 rows of which 32 padding)
    (96, "small"),  # no padding either way: the larger tile
    (128, "small-m32"),  # H=8 T=16: -6.5 % at P=8k ... -1.1 % at P=200k (M=48: 144 rows)
    (129, "small"),
    (256, "small"),  # H=16 T=16: a tie (P=4k -1.2 %, P=32k +1.0 % for M=32)
    (1024, "small"),  # H=64 T=16: M=48 75.2 against 78.9 us at P=4k
]


@pytest.mark.parametrize(("rows", "expected"), CASES)
def test_auto_takes_small_m32_where_it_pads_fewer_rows(report_exe: Path, rows: int, expected: str) -> None:
    assert choice(report_exe, rows) == expected


def test_both_small_shapes_are_reported_with_their_sizes(report_exe: Path) -> None:
    import json

    configs = json.loads(subprocess.run([str(report_exe)], capture_output=True, text=True, check=True).stdout)
    assert configs["small"]["rows_per_cta"] == 48 and configs["small-m32"]["rows_per_cta"] == 32
    assert configs["small-m32"]["dynamic_smem_bytes"] <= 99 * 1024


def test_planned_config_refuses_bad_arguments_by_name_before_any_build() -> None:
    """kernel.planned_config checks its names and tensors on the host (no extension, no GPU)."""
    import torch

    import kernel

    q = torch.zeros(3, 2, 576, dtype=torch.bfloat16)
    idx, qo = torch.zeros(8, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="config must be one of"):
        kernel.planned_config(q, idx, qo, "huge")
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        kernel.planned_config(q, idx, qo)
    with pytest.raises(ValueError, match="qo_indptr must be 1-D"):
        kernel.planned_config(q, idx, torch.tensor([0], dtype=torch.int32))
