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


def choice(exe: Path, rows: int, keys: int, sms: int) -> str:
    res = subprocess.run(
        [str(exe), "rule", str(rows), str(keys), str(sms)], capture_output=True, text=True, check=True
    )
    return res.stdout.strip()


# (rows = tokens x heads, KV indices of the call, SMs) -> the config `auto` takes. The H200 times of
# kernel/NOTES.md v22 are the reason for each side of the line; 188 is the RTX PRO 6000's SM count.
CASES = [
    ((128, 1040, 132), "small-m32"),  # P=1k H=8 T=16: M=32 19.7 -> 17.2 us
    ((128, 8208, 132), "small-m32"),  # P=8k H=8 T=16: 37.4 -> 34.3 us (187 keys an M=48 split)
    ((128, 16400, 132), "small-m32"),  # 373 keys an M=48 split: under the 384-key line
    ((128, 32784, 132), "small"),  # P=32k H=8 T=16: a tie (745 keys a split), M=48 kept
    ((128, 24000, 188), "small-m32"),  # more SMs, shorter splits: the line moves with them
    ((128, 24000, 132), "small"),
    ((256, 4112, 132), "small"),  # P=4k H=16 T=16: a tie (34.8 against 35.1 us)
    ((1024, 4112, 132), "small"),  # P=4k H=64 T=16: M=48 85.9 against 94.4 us
    ((32, 200016, 132), "small-m32"),  # one M=32 tile holds the rows; M=48 would be a third padding
    ((1, 17, 132), "small-m32"),
    ((33, 200016, 132), "small"),
]


@pytest.mark.parametrize(("shape", "expected"), CASES)
def test_auto_takes_small_m32_for_few_rows_and_short_splits(
    report_exe: Path, shape: tuple[int, int, int], expected: str
) -> None:
    assert choice(report_exe, *shape) == expected


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
