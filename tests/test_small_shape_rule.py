"""`auto`'s per-call choices: between `small` (M=48) and `small-m32` on parts that run the mma.sync
kernels in 99 KB (sm_120), and between the two wgmma-ws loops on an H100/H200. The rules are host
code (kernel/csrc/verify_attention.cuh, prefer_small_m32; kernel/csrc/verify_attention_sm90.cuh,
wgmma_ws_pipelined), run here through the host program the ptxas check builds (nvcc, no GPU)."""

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


# (rows = tokens x heads, KV indices of the call, SMs) -> the config `auto` takes. The H200 times
# (`small` against `small-m32`, config forced, one process: kernel/NOTES.md v24 and v27, the v27
# ones from reports/20261130T025624-sweep-sm120-nvidia-h200-ae2ef74) are the reason for each
# 132-SM case; 188 is the RTX PRO 6000's SM count, 170 another sm_120 part's.
CASES = [
    ((128, 4112, 132), "small-m32"),  # P=4k H=8 T=16: 23.5 against 20.3 us (M=48: 144 rows)
    ((128, 32784, 132), "small-m32"),  # P=32k H=8 T=16: 65.4 against 64.3 us
    ((128, 65552, 132), "small"),  # P=64k H=8 T=16: 110.2 against 113.2 us
    ((128, 200016, 132), "small"),  # P=200k H=8 T=16: 294.5 against 308.4 us
    ((64, 131088, 132), "small-m32"),  # P=131k H=4 T=16: 181.6 against 140.5 us (v24)
    ((32, 200016, 132), "small-m32"),  # one M=32 tile; M=48 would be a third padding
    ((32, 4112, 132), "small-m32"),  # P=4k H=2 T=16: 19.4 against 16.4 us
    ((1, 17, 132), "small-m32"),
    ((33, 200016, 132), "small"),  # 2 M=32 tiles (64 rows) against one M=48 tile
    ((96, 65552, 132), "small"),  # no padding either way: the larger tile
    ((256, 4112, 132), "small-m32"),  # P=4k H=16 T=16: a tie (29.1 against 29.1 us, v27 trials)
    ((256, 32784, 132), "small"),  # P=32k H=16 T=16: 108.1 against 116.1 us
    ((512, 32832, 132), "small"),  # P=32k H=8 T=64: 183.5 against 214.3 us
    ((1024, 4112, 132), "small"),  # P=4k H=64 T=16: 61.1 against 67.0 us
    ((1024, 131136, 132), "small"),  # P=131k H=16 T=64: 1316 against 1571 us
    (
        (4096, 32832, 132),
        "small-m32",
    ),  # P=32k H=64 T=64: 1958 against 1576 us (128 tiles fill 132 SMs, 86 do not)
    ((4096, 200064, 188), "small"),  # 188 SMs: 86 M=48 tiles split twice, 128 M=32 tiles once
    ((4096, 200064, 170), "small-m32"),  # 170 SMs: neither splits; 128 tiles fill more of them
]


@pytest.mark.parametrize(("shape", "expected"), CASES)
def test_auto_takes_the_shape_whose_busiest_sm_has_less_work(
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


def test_the_gpu_tests_mirror_of_the_rule_agrees_with_it(report_exe: Path) -> None:
    """tests/test_kernel_gpu.py checks `auto` on a 99 KB part against a Python mirror of the rule;
    the mirror and the host code must agree wherever they are asked."""
    import random

    from test_kernel_gpu import expected_small_shape

    rng = random.Random(7)
    for _ in range(120):
        rows = rng.choice([rng.randint(1, 300), rng.randint(1, 9000)])
        keys = rng.choice([rng.randint(1, 5000), rng.randint(1, 300000)])
        sms = rng.choice([132, 170, 188, rng.randint(1, 200)])
        assert choice(report_exe, rows, keys, sms) == expected_small_shape(rows, keys, sms), (rows, keys, sms)


def wgmma_choice(exe: Path, rows: int, batch: int) -> str:
    res = subprocess.run(
        [str(exe), "wgmma-rule", str(rows), str(batch)], capture_output=True, text=True, check=True
    )
    return res.stdout.strip()


# (rows = tokens x heads, requests) -> the loop `auto` takes on an H100/H200 (wgmma_ws_pipelined in
# kernel/csrc/verify_attention_sm90.cuh). The same-GPU A/Bs behind the line (kernel/NOTES.md, v53
# and v54; reports/20261130T100530-trials-nvidia-h200-fd10f91/ and ...101550-trials-...-de11d27/):
# v41's loop 6-8 % faster with one row tile a request, neither clearly with two, the pipelined
# loop 1-3.5 % faster from four.
WGMMA_CASES = [
    ((16, 1), "wgmma-ws"),  # P=262k H=16 T=1: 86.5 against 93.1 us
    ((64, 1), "wgmma-ws"),  # P=262k H=16 T=4: 89.3 against 95.3 us
    ((128, 1), "wgmma-ws"),  # H=8 T=16: -1.9 to +2.8 %
    ((255, 1), "wgmma-ws"),
    ((256, 1), "wgmma-ws-pipe"),  # P=32k/64k H=16 T=16: -2.0 / -2.4 %
    ((4096, 1), "wgmma-ws-pipe"),
    ((1020, 4), "wgmma-ws"),  # a batch by its mean: 255 rows a request
    ((1024, 4), "wgmma-ws-pipe"),
    ((4096, 16), "wgmma-ws-pipe"),  # B=16 H=16 T=16
]


@pytest.mark.parametrize(("shape", "expected"), WGMMA_CASES)
def test_auto_takes_the_pipelined_loop_from_256_rows_a_request(
    report_exe: Path, shape: tuple[int, int], expected: str
) -> None:
    assert wgmma_choice(report_exe, *shape) == expected


def test_both_wgmma_loops_are_reported_and_fit_sm90(report_exe: Path) -> None:
    import json

    configs = json.loads(subprocess.run([str(report_exe)], capture_output=True, text=True, check=True).stdout)
    assert configs["wgmma-ws"]["rows_per_cta"] == configs["wgmma-ws-pipe"]["rows_per_cta"] == 64
    assert (
        configs["wgmma-ws"]["dynamic_smem_bytes"]
        < configs["wgmma-ws-pipe"]["dynamic_smem_bytes"]
        <= 227 * 1024
    )
