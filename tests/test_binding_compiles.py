"""The torch binding (kernel/csrc/binding.cpp) compiles against this torch's headers and the CUDA
toolkit's, on the CPU machine: a signature that drifted from kernel/csrc/verify_attention.h, or a
typo in an argument check, fails here rather than on the first GPU box that builds the extension.
A syntax and type check only (``-fsyntax-only``); the GPU tests build and run it for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

CSRC = Path(__file__).resolve().parents[1] / "kernel" / "csrc"


def _cuda_include() -> Path | None:
    """The CUDA toolkit's include folder, as nvcc itself reports it (nvcc may be a wrapper script)."""
    if shutil.which("nvcc") is None:
        return None
    res = subprocess.run(
        ["nvcc", "-v", "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
        timeout=60,
    )
    for flag in re.findall(r'INCLUDES="([^"]*)"', res.stdout + res.stderr):
        for path in re.findall(r"-I(\S+)", flag):
            if (Path(path) / "cuda_runtime.h").is_file():
                return Path(path)
    return None


def test_binding_compiles_against_torch_and_cuda_headers(tmp_path: Path) -> None:
    cxx = shutil.which("g++") or shutil.which("c++")
    cuda_inc = _cuda_include()
    torch_inc = Path(torch.__file__).parent / "include"
    if cxx is None or cuda_inc is None:
        pytest.skip("needs a C++ compiler and the CUDA toolkit's headers (nvcc on the PATH)")
    if not (torch_inc / "c10" / "cuda" / "CUDAGuard.h").is_file():
        pytest.skip(f"this torch ({torch.__version__}) ships no c10/cuda headers")
    # A CPU build of torch lacks the header that its CUDA build generates at configure time; an
    # empty one stands in (it only sets export macros for shared-library builds).
    stub = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not (torch_inc / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file():
        stub.parent.mkdir(parents=True)
        stub.write_text("#pragma once\n")
    cmd = [
        cxx, "-std=c++17", "-fsyntax-only", f"-I{tmp_path}", f"-I{torch_inc}",
        f"-I{torch_inc / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{sysconfig.get_paths()['include']}",
        f"-I{cuda_inc}", f"-I{CSRC}", "-DTORCH_EXTENSION_NAME=verify_attention_check",
        str(CSRC / "binding.cpp"),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"binding.cpp does not compile ({sys.platform}):\n{res.stderr[-4000:]}"


def test_the_binding_and_the_python_api_name_the_config_ids_alike() -> None:
    """binding.cpp's error messages name config ids from its own table (kConfigNames); it must
    spell them as kernel/__init__.py maps them, id for id."""
    import kernel

    text = (CSRC / "binding.cpp").read_text()
    table = re.search(r"kConfigNames\[\]\s*=\s*\{([^}]*)\}", text)
    assert table, "kConfigNames not found in binding.cpp"
    names = re.findall(r'"([^"]+)"', table.group(1))
    assert names == [name for name, _ in sorted(kernel._CONFIGS.items(), key=lambda kv: kv[1])]
