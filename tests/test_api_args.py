"""kernel/__init__.py's own argument checks: the ones in Python, which run before the extension is
built or a device is touched, so they are checked here on the CPU (the binding's checks are GPU
tests: tests/test_kernel_gpu.py, test_bad_input_names_the_argument)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_num_sms import _tensors

import kernel


@pytest.mark.parametrize("bad", ["0.125", b"0.5", True, None, [0.1]], ids=repr)
def test_sm_scale_must_be_a_real_number(bad: object) -> None:
    # float() would take the string, the bytes and the bool (as 1.0).
    with pytest.raises(TypeError, match=rf"sm_scale must be a number, got {re.escape(repr(bad))}"):
        kernel.verify_attention(**_tensors(), sm_scale=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("good", [0.125, 1, np.float32(0.5), np.float64(0.5)], ids=repr)
def test_sm_scale_takes_python_and_numpy_numbers(good: object) -> None:
    assert kernel._sm_scale_arg(good) == float(good)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, 0, 1, "false"], ids=repr)
def test_validate_must_be_a_bool(bad: object) -> None:
    # None would reach the extension as False: every data check skipped without a word.
    with pytest.raises(TypeError, match=rf"validate must be True or False, got {re.escape(repr(bad))}"):
        kernel.verify_attention(**_tensors(), sm_scale=0.1, validate=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(_tensors()))
def test_an_argument_that_is_not_a_tensor_is_named(name: str) -> None:
    args = _tensors()
    args[name] = args[name].tolist()  # type: ignore[assignment]
    with pytest.raises(TypeError, match=rf"^{name} must be a torch.Tensor, got list$"):
        kernel.verify_attention(**args, sm_scale=0.1)


@pytest.mark.parametrize("name", ["out", "lse"])
def test_an_output_that_is_not_a_tensor_is_named(name: str) -> None:
    with pytest.raises(TypeError, match=rf"{name} must be None or a torch.Tensor, got ndarray"):
        kernel.verify_attention(**_tensors(), sm_scale=0.1, **{name: np.zeros(3)})


@pytest.mark.parametrize("name", ["q", "kv_indices", "qo_indptr"])
def test_planned_config_names_an_argument_that_is_not_a_tensor(name: str) -> None:
    t = _tensors()
    args = {"q": t["q"], "kv_indices": t["kv_indices"], "qo_indptr": t["qo_indptr"]}
    args[name] = args[name].tolist()  # type: ignore[assignment]
    with pytest.raises(TypeError, match=rf"{name} must be a torch.Tensor, got list"):
        kernel.planned_config(**args)
