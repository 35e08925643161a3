"""The binding's error messages (kernel/csrc/messages.h), built by a CPU torch extension.

The messages must carry numbers, shapes, strides, dtypes and devices without streaming numbers
through an ostream (kernel/NOTES.md, "bad-input crash"). The header is CUDA-free, so this runs on
any machine with a C++ compiler; it takes ~30 s to compile.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

CSRC = Path(__file__).resolve().parents[1] / "kernel" / "csrc"

SOURCE = r"""
#include <torch/extension.h>
#include "messages.h"

void fail_ints(int64_t b, int64_t value) {
  VA_CHECK(false, "kv_indptr must be non-decreasing: kv_indptr[", b, "] = ", value, " < kv_indptr[", b - 1, "]");
}
void fail_size_t(int64_t n) { VA_CHECK(false, "index ", static_cast<size_t>(n), " of ", static_cast<int32_t>(7)); }
void fail_double(double x) { VA_CHECK(false, "sm_scale must be a finite positive number, got ", x); }
void fail_tensor(const at::Tensor& t) {
  VA_CHECK(t.is_contiguous(), "q must be contiguous (shape ", va_messages::text(t.sizes()), ", strides ",
           va_messages::text(t.strides()), ", dtype ", t.scalar_type(), ", device ", t.device(), ")");
}
void holds(int64_t x) { VA_CHECK(x >= 0, "never formatted: ", x); }
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on the PATH")
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="va_messages_test",
        cpp_sources=SOURCE,
        functions=["fail_ints", "fail_size_t", "fail_double", "fail_tensor", "holds"],
        extra_include_paths=[str(CSRC)],
        build_directory=str(tmp_path_factory.mktemp("va_messages_build")),
    )


def test_integers_are_written_in_full(ext) -> None:
    with pytest.raises(RuntimeError, match=r"kv_indptr\[2\] = -9000000001 < kv_indptr\[1\]"):
        ext.fail_ints(2, -9000000001)


def test_unsigned_and_narrow_integers(ext) -> None:
    with pytest.raises(RuntimeError, match=r"index 18446744073709551615 of 7"):
        ext.fail_size_t(-1)


@pytest.mark.parametrize(
    ("value", "text"), [(float("nan"), "nan"), (-0.1, "-0.1"), (0.0721687836, "0.0721687836")]
)
def test_doubles(ext, value: float, text: str) -> None:
    with pytest.raises(RuntimeError) as info:
        ext.fail_double(value)
    assert str(info.value).splitlines()[0].endswith(f"got {text}")


def test_shape_strides_dtype_and_device(ext) -> None:
    t = torch.empty(4, 3, 576, dtype=torch.bfloat16).transpose(0, 1)
    with pytest.raises(RuntimeError) as info:
        ext.fail_tensor(t)
    assert "shape [3, 4, 576], strides [576, 1728, 1], dtype BFloat16, device cpu" in str(info.value)


def test_nothing_is_raised_when_the_check_holds(ext) -> None:
    ext.holds(0)
