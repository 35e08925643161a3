"""A build without sm_90a code (``VERIFY_ATTN_ARCHS=9.0+PTX``: sm_90 machine code, no wgmma) on a
compute capability 9.0 GPU: the wgmma configs are refused by name, an empty batch included (it
launches nothing, but a caller learns that its config cannot run before its first real batch),
and `auto` runs the mma.sync kernels. The workload runs in a process of its own on that build
(tests/flagged_build.py), so the default build is not replaced."""

from __future__ import annotations

import pytest
import torch
from flagged_build import run_on_build

pytestmark = pytest.mark.gpu

WORKLOAD = r"""
import torch
import kernel
from kernel import tree_mask

cuda = torch.device("cuda")
H = 8


def call(num_draft, config):
    n, p = sum(num_draft), 40
    q = torch.randn(n, H, 576, device=cuda).to(torch.bfloat16)
    kv = torch.randn(p * len(num_draft) + n + 1, 576, device=cuda).to(torch.bfloat16)
    qo = torch.tensor([0, *torch.tensor(num_draft).cumsum(0).tolist()], dtype=torch.int32, device=cuda)
    kv_lens = [p + t for t in num_draft]
    kvp = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=cuda)
    idx = torch.arange(sum(kv_lens), dtype=torch.int32, device=cuda)
    words, indptr = tree_mask.pack_parents([list(range(-1, t - 1)) for t in num_draft])
    args = (q, kv, idx, qo, kvp, words.to(cuda), indptr.to(cuda), 0.1)
    return kernel.verify_attention(*args, config=config), kernel.planned_config(q, idx, qo)


print("build:", kernel.load_extension().build_info())
for config in ("wgmma", "wgmma-ws", "wgmma-ws-pipe"):
    for num_draft in ([], [4]):
        try:
            call(num_draft, config)
        except RuntimeError as e:
            ok = "needs a compute capability 9.0 GPU" in str(e) and "lacks sm_90a code" in str(e)
            print(f"{config} B={len(num_draft)}: {'refused' if ok else 'OTHER ERROR'}: {str(e).splitlines()[0]}")
        else:
            print(f"{config} B={len(num_draft)}: RAN")
(out, lse), planned = call([4, 2], "auto")
torch.cuda.synchronize()
print("auto ran:", planned, bool(out.isfinite().all() and lse.isfinite().all()))
"""


def test_a_build_without_sm90a_refuses_the_wgmma_configs_even_for_an_empty_batch() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("a 9.0+PTX build runs its own machine code only on compute capability 9.0")
    res, tail = run_on_build("", ["-c", WORKLOAD], archs="9.0+PTX")
    assert res.returncode == 0, f"exit {res.returncode}:\n{tail}"
    assert "[not in this build]" in res.stdout, tail
    for config in ("wgmma", "wgmma-ws", "wgmma-ws-pipe"):
        for batch in (0, 1):
            assert f"{config} B={batch}: refused" in res.stdout, tail
    assert "auto ran: " in res.stdout and res.stdout.rstrip().endswith("True"), tail
    assert "auto ran: wgmma" not in res.stdout, tail
