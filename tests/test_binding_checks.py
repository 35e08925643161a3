"""The binding's tensor checks (kernel/csrc/checks.h), built by a CPU torch extension.

Two of them need no GPU to show: an output that shares memory with an input or with the other
output is refused (the kernel would write it while other blocks still read), and an int32 or fp32
tensor that starts inside an element is refused (torch's own views cannot make one, but a tensor
taken from another library can). The header is CUDA-free; this takes ~30 s to compile.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

CSRC = Path(__file__).resolve().parents[1] / "kernel" / "csrc"

SOURCE = r"""
#include <torch/extension.h>
#include "checks.h"

void no_overlap(const at::Tensor& written, const at::Tensor& other) {
  va_checks::check_no_overlap(written, "out", other, "q");
}
void tensor_ok(const at::Tensor& t, bool bf16) {
  va_checks::check_tensor(t, "kv_indices", bf16 ? at::kBFloat16 : t.scalar_type(), t.device());
}
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on the PATH")
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="va_checks_test",
        cpp_sources=SOURCE,
        functions=["no_overlap", "tensor_ok"],
        extra_include_paths=[str(CSRC)],
        build_directory=str(tmp_path_factory.mktemp("va_checks_build")),
    )


N, H = 3, 4


def test_separate_tensors_pass(ext) -> None:
    q = torch.empty(N, H, 576, dtype=torch.bfloat16)
    out = torch.empty(N, H, 512, dtype=torch.bfloat16)
    ext.no_overlap(out, q)
    # Two views of one buffer that do not meet are not an overlap either.
    buf = torch.empty(N * H * (576 + 512), dtype=torch.bfloat16)
    ext.no_overlap(buf[N * H * 576 :].view(N, H, 512), buf[: N * H * 576].view(N, H, 576))


Q_ELEMS, OUT_ELEMS = N * H * 576, N * H * 512


@pytest.mark.parametrize(
    "offset",
    [
        pytest.param(0, id="out at q's start"),
        pytest.param(Q_ELEMS - OUT_ELEMS, id="out at q's end"),
        pytest.param(Q_ELEMS - 1, id="one element shared"),
        pytest.param(-OUT_ELEMS + 1, id="one element shared from below"),
    ],
)
def test_an_output_sharing_memory_is_refused(ext, offset: int) -> None:
    buf = torch.empty(OUT_ELEMS + Q_ELEMS + OUT_ELEMS, dtype=torch.bfloat16)
    q = buf[OUT_ELEMS : OUT_ELEMS + Q_ELEMS].view(N, H, 576)
    out = buf[OUT_ELEMS + offset :][:OUT_ELEMS].view(N, H, 512)
    with pytest.raises(
        RuntimeError, match=r"out must not share memory with q \(the kernel writes out while it reads q\)"
    ):
        ext.no_overlap(out, q)


def test_an_fp32_view_of_an_input_is_refused(ext) -> None:
    q = torch.empty(N, H, 576, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="out must not share memory with q"):
        ext.no_overlap(q.view(-1)[: 2 * N * H].view(torch.float32).view(N, H), q)


def test_the_same_tensor_is_refused(ext) -> None:
    t = torch.empty(N, H, 512, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="out must not share memory with q"):
        ext.no_overlap(t, t)


def test_an_int32_tensor_inside_an_element_is_refused(ext) -> None:
    raw = np.zeros(4 * 64 + 1, dtype=np.uint8)
    shifted = raw[1:] if raw[1:].ctypes.data % 4 else raw[2:][: 4 * 63]
    t = torch.from_numpy(shifted[: 4 * 63].view(np.int32))
    assert t.data_ptr() % 4 != 0, "numpy gave an aligned view; the test needs a misaligned one"
    with pytest.raises(
        RuntimeError, match=r"kv_indices must start at a 4-byte aligned address, got one \d bytes past it"
    ):
        ext.tensor_ok(t, False)
    ext.tensor_ok(torch.zeros(63, dtype=torch.int32), False)


def test_a_bf16_tensor_off_16_bytes_is_refused(ext) -> None:
    t = torch.empty(65, dtype=torch.bfloat16)[1:]
    with pytest.raises(
        RuntimeError, match=r"must start at a 16-byte aligned address, got one 2 bytes past it"
    ):
        ext.tensor_ok(t, True)
