"""The sm_90a kernel's wgmma tile steps (shared-memory swizzle, descriptors, accumulator layout)
against torch matmuls on one tile: S = Q K^T over 576 dims, O = P V over 64 keys.

A wrong descriptor field or swizzle shows up here as a scrambled S or O, localised to one step,
before it would show up as a parity failure of the whole kernel. Needs an sm_90 GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_kernel_gpu import runs_wgmma

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def probe():
    if not (torch.cuda.is_available() and runs_wgmma()):
        pytest.skip("wgmma needs a compute capability 9.0 GPU (H100/H200)")
    from kernel import build

    return build.load_cuda_extension(
        "verify_attention_wgmma_probe",
        [ROOT / "tests" / "wgmma_probe.cu"],
        "9.0a",
        list(build.cuda_flags("9.0a")),
    )


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(64, 576, generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn(64, 576, generator=g, device="cuda").to(torch.bfloat16)
    p = torch.rand(64, 64, generator=g, device="cuda").to(torch.bfloat16)
    return q, k, p


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_qk_tile_matches_matmul(probe, seed: int) -> None:
    q, k, p = _inputs(seed)
    s, _ = probe.probe(q, k, p)
    ref = q.double() @ k.double().T
    torch.testing.assert_close(s.double(), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pv_tile_matches_matmul(probe, seed: int) -> None:
    q, k, p = _inputs(seed)
    _, o = probe.probe(q, k, p)
    ref = p.double() @ k[:, :512].double()
    torch.testing.assert_close(o.double(), ref, rtol=1e-4, atol=1e-3)


def test_probe_detects_a_transposed_operand(probe) -> None:
    """Control: the comparison fails for a structurally wrong result (S of K Q^T), so a scrambled
    layout cannot pass by accident."""
    q, k, p = _inputs(3)
    s, _ = probe.probe(q, k, p)
    wrong = k.double() @ q.double().T
    assert not torch.allclose(s.double(), wrong, rtol=1e-4, atol=1e-3)
