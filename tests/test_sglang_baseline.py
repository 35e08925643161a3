"""The "sglang-triton-ps1" entry: SGLang's real ``extend_attention_fwd`` against the float64 oracle.

On this CPU-only machine the kernel runs in Triton's interpreter, in a child process: triton
reads TRITON_INTERPRET when sglang's kernels are decorated (at import), so setting it in the
test process would turn every later Triton import into interpreted code.

The interpreter computes bf16 ``tl.dot`` wrongly (relative error ~1e9 with triton 3.9), so the
interpreted case uses fp16 inputs; the oracle reads the same fp16 values, and the tolerances are
DESIGN.md's. bf16 runs on the GPU (tests/test_sglang_adapter.py).

Also here: the entry's availability reasons, and harness/offline_wheels.py's wheel repacking.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

from harness import impl_sglang, offline_wheels
from harness.batch import QK_DIM, V_DIM, VerifyBatch
from harness.oracle import reference
from harness.tree import chain, visibility

REPO = Path(__file__).resolve().parents[1]
REL_TOL, COS_TOL = 1e-2, 0.9999
SM_SCALE = 1 / math.sqrt(192)
PREFIX_LENS = (37, 70)
# Branching trees: a chain mask or a flipped bit changes what a draft token sees.
PARENTS = ((-1, 0, 0, 1), (-1, 0, 1, 0, 3))

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="sglang is not installed (pip install --no-deps sglang==0.5.23 plus its import deps: harness/SGLANG.md)",
)

CHILD = """
import sys, torch
from harness import impl_sglang
from harness.batch import VerifyBatch
fields = torch.load(sys.argv[1], weights_only=True)
batch = VerifyBatch(**fields)
ok, reason = impl_sglang.availability(torch.device("cpu"))
if not ok:
    sys.exit(f"sglang-triton-ps1 is unavailable: {reason}")
out, lse = impl_sglang.prepare(batch)()
torch.save({"out": out, "lse_is_none": lse is None}, sys.argv[2])
"""


def planted_batch(dtype: torch.dtype) -> VerifyBatch:
    """Two requests over a shuffled pool (NaN in unreferenced slots) with planted structure:
    every draft key is aligned with its request's draft queries, so the tree mask decides which
    of them dominate, and the first / last prefix keys are needles for heads 0 / 1."""
    g = torch.Generator().manual_seed(0)
    num_heads = 2
    sizes = [len(p) for p in PARENTS]
    kv_lens = [p + t for p, t in zip(PREFIX_LENS, sizes, strict=True)]
    total = sum(kv_lens)
    pool = torch.full((total + 45, QK_DIM), float("nan"))
    slots = torch.randperm(pool.shape[0], generator=g)[:total]
    keys = torch.randn(total, QK_DIM, generator=g)
    q = torch.randn(sum(sizes), num_heads, QK_DIM, generator=g)
    # Unit directions over all 576 dims, so the RoPE part of q.k matters too.
    draft_dir, needle_dir = torch.nn.functional.normalize(torch.randn(2, QK_DIM, generator=g), dim=-1)
    kv_start, q_start = 0, 0
    for p, t in zip(PREFIX_LENS, sizes, strict=True):
        keys[kv_start + p : kv_start + p + t] += 10 * draft_dir
        q[q_start : q_start + t] += 10 * draft_dir
        keys[kv_start] += 10 * needle_dir
        keys[kv_start + p - 1] -= 10 * needle_dir
        q[q_start : q_start + t, 0] += 10 * needle_dir
        q[q_start : q_start + t, 1] -= 10 * needle_dir
        kv_start, q_start = kv_start + p + t, q_start + t
    pool[slots] = keys
    return VerifyBatch(
        q=q.to(dtype),
        kv_cache=pool.to(dtype),
        kv_indices=slots.to(torch.int32),
        qo_indptr=torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32),
        kv_indptr=torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32),
        prefix_lens=PREFIX_LENS,
        parents=PARENTS,
        sm_scale=SM_SCALE,
    )


def within_tolerance(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, str]:
    a, r = out.double().flatten(0, 1), ref.double().flatten(0, 1)
    rel = float(((a - r).norm(dim=-1) / r.norm(dim=-1)).max())
    cos = float(torch.nn.functional.cosine_similarity(a, r, dim=-1).min())
    return rel <= REL_TOL and cos >= COS_TOL, f"max rel {rel:.3g}, min cos {cos:.6f}"


@needs_sglang
def test_sglang_triton_matches_the_float64_oracle_in_the_interpreter(tmp_path: Path) -> None:
    batch = planted_batch(torch.float16)
    torch.save(dataclasses.asdict(batch), tmp_path / "batch.pt")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "batch.pt"), str(tmp_path / "out.pt")],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    result = torch.load(tmp_path / "out.pt", weights_only=True)
    out = result["out"]
    assert result["lse_is_none"], "extend_attention_fwd gives no lse; the entry must return None for it"
    assert out.shape == (batch.q.shape[0], batch.num_heads, V_DIM) and out.dtype == torch.float16
    assert torch.isfinite(out).all(), "non-finite output: a NaN pool slot was read"

    ref, _ = reference(batch)
    ok, stats = within_tolerance(out, ref)
    assert ok, f"sglang-triton-ps1 vs float64 oracle: {stats}"
    # Mutation controls: this case fails a chain mask and SGLang's default scale 1/sqrt(576).
    chain_vis = [visibility(chain(len(p))) for p in PARENTS]
    assert not within_tolerance(out, reference(batch, visibility=chain_vis)[0])[0]
    wrong_scale = dataclasses.replace(batch, sm_scale=1 / math.sqrt(QK_DIM))
    assert not within_tolerance(out, reference(wrong_scale)[0])[0]


def test_sglang_args_are_what_the_backend_passes_for_mla_verify() -> None:
    batch = planted_batch(torch.bfloat16)
    args = impl_sglang.sglang_verify_args(batch)
    n, p_total = batch.q.shape[0], sum(PREFIX_LENS)
    assert args.k_extend.shape == (n, 1, QK_DIM) and args.v_extend.shape == (n, 1, V_DIM)
    assert args.v_extend.is_contiguous()
    assert args.k_buffer.shape == (batch.kv_cache.shape[0], 1, QK_DIM)
    assert args.v_buffer.data_ptr() == args.k_buffer.data_ptr() and args.v_buffer.shape[-1] == V_DIM
    assert args.kv_indices.dtype == torch.int64 and args.kv_indices.numel() == p_total
    assert args.kv_indptr.dtype == torch.int32 and args.kv_indptr.tolist() == [0, 37, 107]
    assert args.qo_indptr.dtype == torch.int32 and args.qo_indptr.tolist() == [0, 4, 9]
    assert args.mask_indptr.dtype == torch.int64 and args.mask_indptr.tolist() == [0, 4 * 41, 4 * 41 + 5 * 75]
    assert args.custom_mask.dtype == torch.bool and args.custom_mask.numel() == 4 * 41 + 5 * 75
    assert args.max_len_extend == 5
    slots = batch.kv_indices.long()
    assert torch.equal(args.kv_indices, torch.cat([slots[0:37], slots[41:111]]))
    assert torch.equal(args.out_cache_loc, torch.cat([slots[37:41], slots[111:116]]))
    assert torch.equal(args.k_extend, args.k_buffer[args.out_cache_loc])
    # Request 1, draft row 4 (parent 3, grandparent 0): prefix all visible, then drafts 0, 3, 4.
    row = args.custom_mask[4 * 41 + 4 * 75 : 4 * 41 + 5 * 75]
    assert row[:70].all() and row[70:].tolist() == [True, False, False, True, True]
    kwargs = args.kernel_kwargs(torch.empty(0))
    assert kwargs["is_causal"] is True and kwargs["k_scale"] == kwargs["v_scale"] == 1.0
    assert kwargs["sm_scale"] == SM_SCALE
    assert tuple(kwargs) == impl_sglang.KERNEL_PARAMS


def test_unavailable_on_cpu_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok, reason = impl_sglang.availability(torch.device("cpu"))
    assert not ok and "needs a CUDA device" in reason and "TRITON_INTERPRET" not in reason


def test_bf16_inputs_are_refused_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's bf16 dot products are wrong: an error that says so, not a wrong output."""
    fake = impl_sglang.SglangKernel(extend_attention_fwd=None, module="stub", version="0", interpreted=True)
    monkeypatch.setattr(impl_sglang, "load_kernel", lambda: fake)
    with pytest.raises(RuntimeError, match="cannot run bf16 inputs"):
        impl_sglang.prepare(planted_batch(torch.bfloat16))


@pytest.fixture
def fresh_import(monkeypatch: pytest.MonkeyPatch):
    """load_kernel() imports again under the test's sys.modules, and its cache is reset after."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    impl_sglang.load_kernel.cache_clear()
    yield monkeypatch
    impl_sglang.load_kernel.cache_clear()


def _fake_sglang(monkeypatch: pytest.MonkeyPatch, module: str, fwd: object) -> None:
    """An importable ``module`` under a stub ``sglang`` package that has nothing else."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        stub = types.ModuleType(".".join(parts[:i]))
        stub.__path__ = []
        monkeypatch.setitem(sys.modules, stub.__name__, stub)
    sys.modules[module].extend_attention_fwd = fwd


class _NoSglang:
    """A meta-path finder for which sglang is not installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_import_error_is_the_reason(fresh_import: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        fresh_import.delitem(sys.modules, name)
    fresh_import.setattr(sys, "meta_path", [_NoSglang(), *sys.meta_path])
    assert impl_sglang.availability(torch.device("cpu")) == (
        False,
        "ModuleNotFoundError: No module named 'sglang'",
    )


def test_older_release_path_is_used_when_the_new_one_is_missing(fresh_import: pytest.MonkeyPatch) -> None:
    def extend_attention_fwd(*args: object, **kwargs: object) -> None: ...

    old = impl_sglang.KERNEL_MODULES[1]
    extend_attention_fwd.__signature__ = inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for name in impl_sglang.KERNEL_PARAMS
        ]
    )
    _fake_sglang(fresh_import, old, extend_attention_fwd)
    assert impl_sglang.availability(torch.device("cpu")) == (True, "")
    loaded = impl_sglang.load_kernel()
    assert loaded.module == old and loaded.extend_attention_fwd is extend_attention_fwd


def test_a_baseline_that_writes_nothing_fails_parity_not_shows_a_freed_buffer(
    fresh_import: pytest.MonkeyPatch,
) -> None:
    """The entry's output is a fresh allocation, as the backend's: the caching allocator hands
    back the previous entry's freed output of the same size, so a kernel that left rows unwritten
    would show the kernel's values there. Its first call (parity's) NaN-fills the output."""
    from harness import parity
    from harness.bundles import load, to_batch

    def writes_nothing(**kwargs: object) -> None: ...

    writes_nothing.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in impl_sglang.KERNEL_PARAMS]
    )
    _fake_sglang(fresh_import, impl_sglang.KERNEL_MODULES[0], writes_nothing)
    b = load("smoke")
    batch = to_batch(b)
    batch = dataclasses.replace(batch, q=batch.q.half(), kv_cache=batch.kv_cache.half())
    out, lse = impl_sglang.prepare(batch)()
    assert lse is None and bool(out.isnan().all())
    assert parity.check(b, impl_sglang.NAME, out, lse).status == "fail"


def test_a_kernel_without_the_verify_parameters_is_unavailable(fresh_import: pytest.MonkeyPatch) -> None:
    def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_tokens): ...

    _fake_sglang(fresh_import, impl_sglang.KERNEL_MODULES[0], extend_attention_fwd)
    ok, reason = impl_sglang.availability(torch.device("cpu"))
    assert not ok and "qo_indptr" in reason and "custom_mask" in reason


def test_stripped_wheel_keeps_everything_but_compiled_extensions(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-cp312-cp312-manylinux_2_34_x86_64.whl"
    files = {
        "pkg/__init__.py": b"x = 1\n",
        "pkg/_ext.cpython-312-x86_64-linux-gnu.so": b"\x7fELF",
        "pkg/lib.so.1": b"\x7fELF",
    }
    record = (
        "".join(f"{name},sha256=00,{len(data)}\n" for name, data in files.items())
        + "pkg-1.0.dist-info/RECORD,,\n"
    )
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("pkg-1.0.dist-info/RECORD", record)
    dropped = offline_wheels.strip_binaries(wheel)
    assert sorted(dropped) == ["pkg/_ext.cpython-312-x86_64-linux-gnu.so", "pkg/lib.so.1"]
    with zipfile.ZipFile(wheel) as z:
        assert sorted(z.namelist()) == ["pkg-1.0.dist-info/RECORD", "pkg/__init__.py"]
        assert z.read("pkg/__init__.py") == b"x = 1\n"
        assert z.read("pkg-1.0.dist-info/RECORD").decode().splitlines() == [
            "pkg/__init__.py,sha256=00,6",
            "pkg-1.0.dist-info/RECORD,,",
        ]


def test_platform_tags_include_every_older_manylinux() -> None:
    tags = offline_wheels.platform_tags("manylinux_2_34_x86_64")
    assert (
        tags[0] == "manylinux_2_34_x86_64"
        and "manylinux_2_17_x86_64" in tags
        and "manylinux_2_5_x86_64" in tags
    )
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_35_x86_64" not in tags


def test_a_failed_wheel_download_leaves_the_earlier_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "whl"
    dest.mkdir()
    (dest / "old-1.0-py3-none-any.whl").write_bytes(b"the earlier set")

    def no_network(requirements: list[str], stage: Path, *args: object, **kwargs: object) -> None:
        stage.mkdir(parents=True, exist_ok=True)
        (stage / "sglang-0.5.23-py3-none-any.whl").write_bytes(b"half")
        raise subprocess.CalledProcessError(1, ["pip", "download"])

    monkeypatch.setattr(offline_wheels, "pip_download", no_network)
    with pytest.raises(subprocess.CalledProcessError):
        offline_wheels.fetch(dest, "3.12", "manylinux_2_34_x86_64", "0.5.23", strip=False)
    assert sorted(p.name for p in dest.iterdir()) == ["old-1.0-py3-none-any.whl"]

    def downloads(requirements: list[str], stage: Path, *args: object, **kwargs: object) -> None:
        stage.mkdir(parents=True, exist_ok=True)
        name = (
            "sglang-0.5.23-py3-none-any.whl"
            if requirements[0].startswith("sglang")
            else "tqdm-4.0-py3-none-any.whl"
        )
        (stage / name).write_bytes(b"new")

    monkeypatch.setattr(offline_wheels, "pip_download", downloads)
    got = offline_wheels.fetch(dest, "3.12", "manylinux_2_34_x86_64", "0.5.23", strip=False)
    assert [p.name for p in got] == ["sglang-0.5.23-py3-none-any.whl", "tqdm-4.0-py3-none-any.whl"]
    assert sorted(p.name for p in dest.iterdir()) == ["INSTALL.txt", *(p.name for p in got)]


def test_the_wheel_command_says_why_a_download_failed_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise subprocess.CalledProcessError(1, ["pip", "download"])

    monkeypatch.setattr(offline_wheels, "pip_download", no_network)
    assert offline_wheels.main(["--dest", str(tmp_path / "whl")]) == 1
    assert "pip download failed (exit 1" in capsys.readouterr().err
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert offline_wheels.main(["--dest", str(a_file)]) == 2
    assert "expected a folder for the wheels" in capsys.readouterr().err


@needs_sglang
def test_the_parameter_order_matches_the_installed_sglang() -> None:
    """The harness passes KERNEL_PARAMS in order, and a backend may call the adapter positionally
    as it calls SGLang's kernel: both orders are checked against the installed release's own
    signature (in a child process: importing sglang decorates its Triton kernels)."""
    code = (
        "import inspect, json\n"
        "from harness import impl_sglang\n"
        "from kernel.sglang_adapter import extend_attention_fwd as adapter\n"
        "k = impl_sglang.load_kernel()\n"
        "assert not isinstance(k, str), k\n"
        "print(json.dumps([list(inspect.signature(k.extend_attention_fwd).parameters),"
        " list(inspect.signature(adapter).parameters)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    sglang_params, adapter_params = json.loads(done.stdout.strip().splitlines()[-1])
    assert sglang_params[: len(impl_sglang.KERNEL_PARAMS)] == list(impl_sglang.KERNEL_PARAMS)
    shared = sglang_params.index("logit_cap") + 1  # the adapter's own keywords follow
    assert adapter_params[:shared] == sglang_params[:shared]
