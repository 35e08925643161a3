"""`num_sms` (kernel/__init__.py): the SM count a call is laid out for. Its checks run before the
extension is built or a device is touched, so they are checked here on the CPU; the kernel's
results at other SM counts are GPU tests (tests/test_kernel_gpu.py, test_plans_of_other_sm_counts;
tests/test_split_boundaries.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import kernel

BINDING = Path(__file__).parents[1] / "kernel" / "csrc" / "binding.cpp"
BAD = (0, -1, kernel.MAX_NUM_SMS + 1, True, 188.0, "188")


def _tensors() -> dict[str, torch.Tensor]:
    # CPU tensors of the right shapes: the check must fire before anything looks at them.
    i32 = torch.zeros(2, dtype=torch.int32)
    return {
        "q": torch.zeros(1, 1, 576, dtype=torch.bfloat16),
        "kv_cache": torch.zeros(2, 576, dtype=torch.bfloat16),
        "kv_indices": i32,
        "qo_indptr": i32,
        "kv_indptr": i32,
        "tree_mask": i32,
        "tree_mask_indptr": i32,
    }


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_verify_attention_names_a_bad_num_sms(bad: object) -> None:
    with pytest.raises(
        ValueError, match=rf"num_sms must be None or an int from 1 to 1024, got {re.escape(repr(bad))}"
    ):
        kernel.verify_attention(**_tensors(), sm_scale=0.1, num_sms=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_planned_config_names_a_bad_num_sms(bad: object) -> None:
    t = _tensors()
    with pytest.raises(ValueError, match="num_sms must be None or an int from 1 to 1024"):
        kernel.planned_config(t["q"], t["kv_indices"], t["qo_indptr"], num_sms=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("good", (None, 1, 132, 188, kernel.MAX_NUM_SMS))
def test_good_values_pass_to_the_extension(good: int | None) -> None:
    assert kernel._num_sms_arg(good) == (good or 0)


def test_the_python_api_and_the_binding_keep_one_bound() -> None:
    text = BINDING.read_text()
    found = re.search(r"constexpr int64_t kMaxPlanSms = (\d+);", text)
    assert found, "kMaxPlanSms not found in binding.cpp"
    assert int(found.group(1)) == kernel.MAX_NUM_SMS
    # Both entry points check it, and the extension takes the name users pass.
    assert text.count("check_num_sms(num_sms);") == 2
    assert text.count('py::arg("num_sms") = 0') == 2
