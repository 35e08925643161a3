"""Parity checks: what passes, what fails and why, and the parity command end to end."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import bundles, parity, readout
from harness.registry import Implementation
from harness.results import ParityRow, load_results

Loader = Callable[[str], bundles.Bundle]


def golden(b: bundles.Bundle) -> torch.Tensor:
    return b.golden_out.double().clone()


def test_the_goldens_pass(bundle: Loader) -> None:
    b = bundle("ddtree")
    row = parity.check(b, "x", golden(b), b.golden_lse.double())
    assert row.status == "pass", row.reason
    assert row.max_rel_err == 0 and row.tokens_match and row.path_match and row.num_rows == 16 * 16


def test_small_honest_error_passes(bundle: Loader) -> None:
    b = bundle("ddtree")
    out = golden(b)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(out.shape, generator=g, dtype=torch.float64)
    out += 0.005 * noise / noise.norm(dim=-1, keepdim=True) * out.norm(dim=-1, keepdim=True)
    row = parity.check(b, "x", out, None)
    assert row.status == "pass", row.reason


def test_one_row_off_by_2_percent_fails_and_is_named(bundle: Loader) -> None:
    b = bundle("ddtree")
    out = golden(b)
    out[5, 3] *= 1.02
    row = parity.check(b, "x", out, None)
    assert row.status == "fail"
    assert row.worst_row == "token 5, head 3"
    assert "rel err 0.02 > 0.01 (1 rows, worst token 5, head 3)" in row.reason


@pytest.mark.parametrize("factor", [0.99, 1.01])
def test_the_rel_and_lse_thresholds_are_where_design_puts_them(bundle: Loader, factor: float) -> None:
    """One row off by just under / just over DESIGN's rel 1e-2 (a scaled row keeps its cosine 1),
    and one lse off by just under / just over 1e-3: a check looser or tighter by 1 % shows."""
    b = bundle("smoke")
    out = golden(b)
    out[1, 4] *= 1 + factor * parity.REL_TOL
    row = parity.check(b, "x", out, None)
    assert row.status == ("pass" if factor < 1 else "fail"), row.reason
    assert row.max_rel_err == pytest.approx(factor * parity.REL_TOL, rel=1e-9)
    lse = b.golden_lse.double().clone()
    lse[2, 3] += factor * parity.LSE_TOL
    row = parity.check(b, "x", golden(b), lse)
    assert row.status == ("pass" if factor < 1 else "fail"), row.reason
    assert row.max_lse_abs_err == pytest.approx(factor * parity.LSE_TOL, rel=1e-6)


def test_design_fixes_the_thresholds() -> None:
    assert (parity.REL_TOL, parity.COS_TOL, parity.LSE_TOL) == (1e-2, 0.9999, 1e-3)


def test_an_orthogonal_error_lowers_the_cosine(bundle: Loader) -> None:
    b = bundle("smoke")
    out = golden(b)
    ref = out[2, 1].clone()
    other = torch.roll(ref, 1)
    other -= (other @ ref) / (ref @ ref) * ref
    out[2, 1] = ref + 0.02 * ref.norm() * other / other.norm()
    row = parity.check(b, "x", out, None)
    assert row.min_cosine == pytest.approx(1 / (1 + 0.02**2) ** 0.5, rel=1e-9)
    assert "cosine 0.999800 < 0.9999 (1 rows)" in row.reason


def test_nan_output_fails(bundle: Loader) -> None:
    b = bundle("smoke")
    out = golden(b)
    out[1, 2, 7] = float("nan")
    row = parity.check(b, "x", out, None)
    assert row.status == "fail"
    assert "non-finite out (1 values, first at token 1, head 2)" in row.reason


def test_lse_is_checked_when_given_and_recorded_as_absent_otherwise(bundle: Loader) -> None:
    b = bundle("smoke")
    lse = b.golden_lse.double().clone()
    assert parity.check(b, "x", golden(b), None).max_lse_abs_err is None
    assert parity.check(b, "x", golden(b), None).status == "pass"
    lse[0, 0] += 2e-3
    row = parity.check(b, "x", golden(b), lse)
    assert row.status == "fail" and "lse abs err 0.002 > 0.001" in row.reason


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda lse: torch.full_like(lse, float("nan")), "lse abs err inf > 0.001"),
        (lambda lse: lse[:, :3], "lse has shape [4, 3], expected [4, 8]"),
    ],
    ids=["never-written", "wrong-shape"],
)
def test_an_lse_never_written_or_of_the_wrong_shape_fails(bundle: Loader, make, message: str) -> None:
    """The kernel's parity entry fills lse with NaN before the call (impl_kernel.py), so that a
    path which never writes it fails here rather than comparing nothing."""
    b = bundle("smoke")
    row = parity.check(b, "x", golden(b), make(b.golden_lse.double().clone()))
    assert row.status == "fail" and message in row.reason


def test_wrong_shape_fails(bundle: Loader) -> None:
    b = bundle("smoke")
    row = parity.check(b, "x", golden(b)[:, :4], None)
    assert row.status == "fail" and "out has shape [4, 4, 512], expected [4, 8, 512]" in row.reason


def test_swapped_positions_flip_tokens_and_path(bundle: Loader) -> None:
    b = bundle("ragged")
    assert b.qo_indptr.tolist()[2:5] == [5, 21, 54]
    out = golden(b)
    out[[20, 21]] = out[[21, 20]]  # request 2's last draft token and request 3's root exchange outputs
    row = parity.check(b, "x", out, None)
    assert row.status == "fail"
    assert not row.tokens_match and "2 target tokens differ (first at token 20)" in row.reason
    # Request 3's walk starts at its root, whose token now differs: its accepted path changes.
    assert not row.path_match and "accepted path differs in request(s) [3]" in row.reason


def test_error_at_the_tolerance_in_the_worst_direction_keeps_every_token(bundle: Loader) -> None:
    """The certificate: push each position's output by TOL * ||f|| straight towards its closest
    rival token; the golden token must still win."""
    b = bundle("ragged")
    f = golden(b).reshape(b.num_tokens, -1).numpy()
    w = readout.readout_matrix(b.readout_seed, b.num_heads)
    logits = f @ w.T
    for i in range(b.num_tokens):
        g = int(b.target_tokens[i])
        others = [j for j in range(readout.VOCAB) if j != g]
        diffs = w[g] - w[others]
        ratio = (logits[i, g] - logits[i, others]) / np.linalg.norm(diffs, axis=1)
        rival = others[int(np.argmin(ratio))]
        direction = (w[rival] - w[g]) / np.linalg.norm(w[rival] - w[g])
        pushed = f[i] + readout.TOL * np.linalg.norm(f[i]) * direction
        assert int(np.argmax(w @ pushed)) == g


def test_certified_ratio_is_the_formula() -> None:
    out = torch.zeros(1, 1, 512, dtype=torch.float64)
    codes = readout.codes(3)
    out[0, 0] = torch.from_numpy(codes[7])
    ratios = readout.certified_ratios(out, 3)
    f, w = codes[7], codes
    gaps = [
        (f @ w[7] - f @ w[j]) / (readout.TOL * np.linalg.norm(f) * np.linalg.norm(w[7] - w[j]))
        for j in range(64)
        if j != 7
    ]
    assert ratios[0] == pytest.approx(min(gaps), rel=1e-12)


def fake(
    name: str, available: bool = True, run: Callable[[], tuple] | None = None, returns_lse: bool = True
) -> Implementation:
    return Implementation(
        name=name,
        description="test entry",
        availability=lambda device: (
            available,
            "" if available else "needs hardware this test does not have",
        ),
        prepare=lambda batch: run,
        device_kind="any",
        returns_lse=returns_lse,
    )


def test_unavailable_and_erroring_implementations_are_reported(bundle: Loader) -> None:
    def boom() -> tuple:
        raise RuntimeError("kernel launch failed")

    impls = [fake("absent", available=False), fake("broken", run=boom)]
    rows, unavailable = parity.run_parity(["smoke"], impls, torch.device("cpu"), log=lambda *_: None)
    assert [(r.impl, r.status) for r in rows] == [("absent", "unavailable"), ("broken", "error")]
    assert rows[0].reason == "needs hardware this test does not have"
    assert rows[1].reason == "RuntimeError: kernel launch failed"
    assert unavailable == [{"impl": "absent", "reason": "needs hardware this test does not have"}]
    assert parity.verdict(rows, with_mutations=False)[0] == 1


def test_a_run_checks_each_implementation_s_lse_end_to_end(bundle: Loader) -> None:
    """Through run_parity, as `nox -s parity` runs: an output exactly the goldens' with an lse
    2e-3 off (twice DESIGN.md's 1e-3) fails, and its lse error is recorded; the exact lse passes."""
    golden = bundle("smoke")
    exact = fake("exact", run=lambda: (golden.golden_out.clone(), golden.golden_lse.clone()))
    off = fake("lse-off", run=lambda: (golden.golden_out.clone(), golden.golden_lse + 2e-3))
    rows, _ = parity.run_parity(["smoke"], [exact, off], torch.device("cpu"), log=lambda *_: None)
    by_impl = {r.impl: r for r in rows}
    assert by_impl["exact"].status == "pass" and by_impl["exact"].max_lse_abs_err == 0
    assert by_impl["lse-off"].status == "fail" and "lse" in by_impl["lse-off"].reason
    assert by_impl["lse-off"].max_lse_abs_err == pytest.approx(2e-3, rel=1e-3)
    assert by_impl["lse-off"].max_rel_err == 0  # the out alone would have passed


def test_an_entry_registered_with_lse_that_returns_none_fails(bundle: Loader) -> None:
    """An lse of None skips the lse check: for an entry registered as returning lse (the kernel,
    the oracle) that is a failure, or an off-by-one split that only lse catches on the CI bundles
    (bundles/README.md) would pass; an entry registered without lse (SGLang's) passes and says so."""
    golden = bundle("smoke")
    run = lambda: (golden.golden_out.clone(), None)  # noqa: E731
    with_lse, without = fake("kernel-like", run=run), fake("sglang-like", run=run, returns_lse=False)
    rows, _ = parity.run_parity(["smoke"], [with_lse, without], torch.device("cpu"), log=lambda *_: None)
    by_impl = {r.impl: r for r in rows}
    assert by_impl["kernel-like"].status == "fail"
    assert "lse not returned" in by_impl["kernel-like"].reason
    assert by_impl["sglang-like"].status == "pass"
    assert by_impl["sglang-like"].reason == "lse not provided: output and tokens checked"
    assert parity.verdict(rows, with_mutations=False)[0] == 1


def test_the_registered_entries_say_whether_they_return_lse() -> None:
    from harness.registry import implementations

    returns = {i.name: i.returns_lse for i in implementations()}
    assert returns["sglang-triton-ps1"] is False
    assert returns["oracle"] is True and returns["verify-attn-cuda"] is True


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            lambda g: (g.golden_out.numpy(), g.golden_lse),
            "out is ndarray, expected a torch.Tensor [4, 8, 512]",
        ),
        (
            lambda g: (g.golden_out.clone(), g.golden_lse.numpy()),
            "lse is ndarray, expected a torch.Tensor [4, 8]",
        ),
    ],
    ids=["out", "lse"],
)
def test_an_output_that_is_not_a_tensor_is_a_failing_row_not_a_crash(
    bundle: Loader, result: Callable[[bundles.Bundle], tuple], message: str
) -> None:
    golden = bundle("smoke")
    impls = [
        fake("numpy-out", run=lambda: result(golden)),
        fake("exact", run=lambda: (golden.golden_out, golden.golden_lse)),
    ]
    rows, _ = parity.run_parity(["smoke"], impls, torch.device("cpu"), log=lambda *_: None)
    assert [(r.impl, r.status) for r in rows] == [("numpy-out", "fail"), ("exact", "pass")]
    assert message in rows[0].reason


def test_an_infinite_lse_error_is_recorded_as_no_number_not_the_largest_float(bundle: Loader) -> None:
    b = bundle("smoke")
    lse = b.golden_lse.double().clone()
    lse[1, 2] = float("inf")
    row = parity.check(b, "x", golden(b), lse)
    assert row.status == "fail" and "lse abs err inf > 0.001" in row.reason
    assert row.max_lse_abs_err is None


def test_an_unavailable_row_names_the_bundle_as_the_run_rows_do(bundle: Loader) -> None:
    golden = bundle("smoke")
    impls = [
        fake("absent", available=False),
        fake("exact", run=lambda: (golden.golden_out, golden.golden_lse)),
    ]
    path = str(bundles.bundle_path("smoke"))
    rows, _ = parity.run_parity([path], impls, torch.device("cpu"), log=lambda *_: None)
    assert [(r.bundle, r.impl, r.status) for r in rows] == [
        ("smoke", "absent", "unavailable"),
        ("smoke", "exact", "pass"),
    ]


def row(impl: str, status: str, bundle: str = "smoke") -> ParityRow:
    return ParityRow(bundle=bundle, impl=impl, status=status)


def test_verdict_passes_only_a_clean_run() -> None:
    clean = [row("oracle", "pass"), row("verify-attn-cuda", "unavailable")]
    assert parity.verdict(clean, with_mutations=False)[0] == 0
    assert parity.verdict([*clean, row("verify-attn-cuda", "fail", "ddtree")], with_mutations=False)[0] == 1


def test_verdict_fails_an_uncaught_mutant_or_a_failing_control() -> None:
    caught = [
        row("oracle", "pass"),
        row("control:oracle-bf16", "pass"),
        row("mutant:a", "pass"),
        row("mutant:a", "fail", "ddtree"),
    ]
    assert parity.verdict(caught, with_mutations=True)[0] == 0
    assert parity.verdict([*caught, row("mutant:b", "pass")], with_mutations=True)[0] == 1
    assert (
        parity.verdict([*caught, row("control:oracle-bf16", "fail", "ddtree")], with_mutations=True)[0] == 1
    )
    # A mutant that only errs or cannot run is not caught: parity never compared its output.
    for status in ("error", "unavailable"):
        code, notes = parity.verdict(
            [*caught, row("mutant:b", status), row("mutant:b", "pass", "ddtree")], True
        )
        assert code == 1 and "mutants parity did not catch on any bundle: mutant:b" in notes


def test_default_out_dir_names_time_device_and_commit() -> None:
    from datetime import datetime, timezone

    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    path = parity.default_out_dir(now, {"name": "NVIDIA H200"}, {"sha": "0123456789abcdef"})
    assert path == parity.REPORTS_DIR / "20250102T030405-parity-nvidia-h200-0123456"
    assert parity.default_out_dir(now, None, {"sha": None}).name == "20250102T030405-parity-cpu-nogit"


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parity.register_cli(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_parity_command_writes_results_and_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(
        [
            "parity",
            "--bundles",
            "smoke,ddtree",
            "--impls",
            "oracle",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    results = load_results(tmp_path)
    assert [(r.bundle, r.impl, r.status) for r in results.parity] == [
        ("smoke", "oracle", "pass"),
        ("ddtree", "oracle", "pass"),
    ]
    assert all(r.max_lse_abs_err is not None for r in results.parity)  # the lse was compared
    assert (tmp_path / "index.html").is_file()
    assert json.loads((tmp_path / "results.json").read_text())["kind"] == "parity"
    assert "smoke" in capsys.readouterr().out


def test_parity_command_with_mutations_records_failing_mutants(tmp_path: Path) -> None:
    code = run_cli(
        [
            "parity",
            "--bundles",
            "smoke,ddtree",
            "--impls",
            "oracle",
            "--device",
            "cpu",
            "--mutations",
            "--out",
            str(tmp_path),
        ]
    )
    results = load_results(tmp_path)
    mutant_rows = [r for r in results.parity if r.impl.startswith("mutant:")]
    assert mutant_rows and any(r.status == "fail" for r in mutant_rows)
    assert {r.status for r in results.parity if r.impl == "control:oracle-bf16"} == {"pass"}
    assert code == 0, results.notes


def test_the_recorded_command_spells_out_abbreviated_options(tmp_path: Path) -> None:
    """argparse takes ``--bund`` for ``--bundles``; results.json records the option's full name,
    since compare keys a narrowed run (``--bundles smoke``) apart by its recorded command."""
    assert (
        run_cli(["parity", "--bund", "smoke", "--impls", "oracle", "--dev", "cpu", "--out", str(tmp_path)])
        == 0
    )
    command = load_results(tmp_path).command
    assert command == "python -m harness parity --bundles smoke --impls oracle --device cpu"
    from harness.compare import run_key

    assert run_key(load_results(tmp_path)).grid.startswith("smoke")


def test_without_out_a_reports_folder_that_cannot_be_written_exits_2_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    reports.write_text("a file where the reports folder should be")
    monkeypatch.setattr(parity, "REPORTS_DIR", reports)
    monkeypatch.setattr(parity, "run_parity", no_run)
    assert run_cli(["parity", "--bundles", "smoke", "--impls", "oracle", "--device", "cpu"]) == 2
    assert f"no --out: the reports folder {reports} is a file" in capsys.readouterr().err


def test_parity_command_rejects_an_unknown_implementation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(
        ["parity", "--bundles", "smoke", "--impls", "nope", "--device", "cpu", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "--impls: unknown implementation(s) nope; known: " in capsys.readouterr().err


def no_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("parity ran although an argument was bad")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--impls", ",", "--impls ',' names nothing"),
        ("--bundles", ",", "--bundles ',' names nothing"),
        ("--bundles", "smoke,nope", "--bundles: nope: neither a canonical bundle (smoke, "),
    ],
)
def test_a_bad_selection_exits_2_before_running(
    option: str,
    value: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(parity, "run_parity", no_run)
    argv = {"--bundles": "smoke", "--impls": "oracle", option: value}
    code = run_cli(
        ["parity", *(x for kv in argv.items() for x in kv), "--device", "cpu", "--out", str(tmp_path)]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_device_cuda_without_cuda_exits_2_naming_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(parity, "run_parity", no_run)
    code = run_cli(
        ["parity", "--bundles", "smoke", "--impls", "oracle", "--device", "cuda", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "--device cuda: no CUDA device is visible to torch (use --device cpu)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("where", "message"),
    [("file", "is a file; expected a folder"), ("file/run", "cannot create or write a file there")],
)
def test_an_out_that_cannot_be_written_exits_2_before_running(
    where: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr(parity, "run_parity", no_run)
    out = tmp_path / where
    code = run_cli(
        ["parity", "--bundles", "smoke", "--impls", "oracle", "--device", "cpu", "--out", str(out)]
    )
    assert code == 2
    assert f"--out {out}" in (err := capsys.readouterr().err) and message in err
    assert (tmp_path / "file").read_text() == "not a folder"


def test_an_out_folder_is_probed_before_running_and_made_with_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "new" / "run"

    def run_parity(*args: object, **kwargs: object) -> tuple[list[ParityRow], list[dict[str, str]]]:
        # Probed and removed again: the folder appears only with the report.
        assert not out.exists() and not out.parent.exists()
        return [row("oracle", "pass")], []

    monkeypatch.setattr(parity, "run_parity", run_parity)
    assert (
        run_cli(["parity", "--bundles", "smoke", "--impls", "oracle", "--device", "cpu", "--out", str(out)])
        == 0
    )
    assert (out / "results.json").is_file()


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(pool_seed=-1), "'pool_seed' = -1"),
        (lambda d: d["goldens"].update(readout_seed=2**32), "'goldens.readout_seed' = 4294967296"),
        (lambda d: d["goldens"].update(accepted_path=[[0, 999]]), "'goldens.accepted_path[0][1]' = 999"),
    ],
)
def test_a_corrupt_bundle_exits_2_naming_the_field_not_as_a_failing_implementation(
    edit: Callable[[dict], None], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = torch.load(bundles.bundle_path("smoke"), weights_only=True)
    edit(d)
    path = tmp_path / "bad.pt"
    torch.save(d, path)
    code = run_cli(
        [
            "parity",
            "--bundles",
            str(path),
            "--impls",
            "oracle",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    assert field in capsys.readouterr().err


def test_registered_gpu_entries_are_unavailable_on_a_cpu_run(tmp_path: Path) -> None:
    code = run_cli(["parity", "--bundles", "smoke", "--device", "cpu", "--out", str(tmp_path)])
    results = load_results(tmp_path)
    statuses = {r.impl: r.status for r in results.parity}
    assert statuses["oracle"] == "pass"
    assert statuses["verify-attn-cuda"] == "unavailable" and statuses["sglang-triton-ps1"] == "unavailable"
    assert code == 0


@pytest.mark.parametrize("held", ["results.json", "results.json.gz"])
def test_an_out_that_already_holds_a_run_exits_2_before_running_and_keeps_it(
    held: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / held).write_text("an earlier run")
    monkeypatch.setattr(parity, "run_parity", no_run)
    code = run_cli(
        ["parity", "--bundles", "smoke", "--impls", "oracle", "--device", "cpu", "--out", str(tmp_path)]
    )
    assert code == 2
    assert f"--out {tmp_path} already holds a run ({held})" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == [held] and (
        tmp_path / held
    ).read_text() == "an earlier run"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--impls", "--impls '' names nothing"),
        ("--bundles", "--bundles '' names nothing"),
        ("--out", "--out is empty; expected a folder"),
    ],
)
def test_an_empty_value_is_not_the_default_and_exits_2_naming_the_option(
    option: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(parity, "run_parity", no_run)
    monkeypatch.setattr(parity, "REPORTS_DIR", tmp_path / "reports")
    argv = {"--bundles": "smoke", "--impls": "oracle", "--out": str(tmp_path / "run"), option: ""}
    assert run_cli(["parity", *(x for kv in argv.items() for x in kv), "--device", "cpu"]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_bundle_named_twice_is_checked_once(tmp_path: Path) -> None:
    smoke_file = str(bundles.bundle_path("smoke"))
    argv = ["--bundles", f"smoke,ddtree,smoke,{smoke_file}", "--impls", "oracle,oracle"]
    assert run_cli(["parity", *argv, "--device", "cpu", "--out", str(tmp_path)]) == 0
    results = load_results(tmp_path)
    assert [(r.bundle, r.impl) for r in results.parity] == [("smoke", "oracle"), ("ddtree", "oracle")]
    # the recorded command says what ran, so compare groups it with its like
    assert results.command == "python -m harness parity --bundles smoke,ddtree --impls oracle --device cpu"


def test_two_files_of_one_bundle_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy.pt"
    copy.write_bytes(bundles.bundle_path("smoke").read_bytes())
    argv = ["--bundles", f"smoke,{copy}", "--impls", "oracle", "--device", "cpu"]
    assert run_cli(["parity", *argv, "--out", str(tmp_path / "run")]) == 2
    assert f"--bundles: {copy} holds bundle 'smoke', as smoke does" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_two_files_of_one_bundle_are_refused_before_any_bundle_runs(tmp_path: Path) -> None:
    copy = tmp_path / "copy.pt"
    copy.write_bytes(bundles.bundle_path("smoke").read_bytes())
    ran = []
    impl = fake("counted", run=lambda: ran.append(1))
    with pytest.raises(bundles.BundleError, match="expected each bundle once"):
        parity.run_parity(["smoke", "ddtree", str(copy)], [impl], torch.device("cpu"), log=lambda *_: None)
    assert not ran


def test_impls_of_which_none_is_available_exit_2_saying_nothing_was_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(parity, "run_parity", no_run)
    argv = ["--bundles", "smoke", "--impls", "verify-attn-cuda", "--device", "cpu"]
    assert run_cli(["parity", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--impls: no implementation named is available on cpu (verify-attn-cuda: " in err
    assert "nothing would be checked" in err and not (tmp_path / "run").exists()


def test_a_report_that_cannot_be_written_exits_2_not_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """1 says an implementation failed; a full disk is not one."""
    import harness.report
    from harness.results import ResultsError

    def full(results: object, out_dir: Path) -> None:
        raise ResultsError(f"{out_dir}: cannot write the run there (No space left on device)")

    monkeypatch.setattr(parity, "run_parity", lambda *a, **k: ([row("oracle", "pass")], []))
    monkeypatch.setattr(harness.report, "write_run", full)
    argv = ["--bundles", "smoke", "--impls", "oracle", "--device", "cpu", "--out", str(tmp_path / "run")]
    assert run_cli(["parity", *argv]) == 2
    assert "parity: the report could not be written" in capsys.readouterr().err
