"""The bring-up command (harness/bringup.py) and mma.sync's microbenchmark (harness/mma_peak.py).

The plan, the skips and the record are checked on the CPU machine with stand-in steps (child
processes of this Python that pass, fail, hang or write a report folder); the real steps are
the project's own commands, tested where they live. The microbenchmark is compiled for sm_90
and sm_120 here (nvcc needs no GPU); running it needs one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import bringup, mma_peak
from harness.bringup import Box, Step


def _args(**kw) -> argparse.Namespace:
    base = {"only": None, "skip": None, "out": None, "list": False, "step_timeout": None}
    base.update(kw)
    return argparse.Namespace(**base)


def _py(code: str) -> tuple[str, ...]:
    return ("-c", code)


# ---------------------------------------------------------------------------------------------
# The plan


def _by_name(steps):
    return {s.name: s for s in steps}


def test_one_gpu_sweeps_plainly_and_skips_tp_with_its_reason() -> None:
    steps = _by_name(bringup.plan(Box(gpus=1, name="NVIDIA H200", capability="9.0")))
    assert "--gpus" not in steps["sweep"].argv and "--gpus" not in steps["sweep-sm120"].argv
    assert steps["tp"].skip(Box(gpus=1), None) == "tensor-parallel timing needs 2 GPUs or more; 1 visible"


@pytest.mark.parametrize(("gpus", "tp"), [(2, "2"), (3, "2"), (4, "4"), (7, "4"), (8, "8"), (16, "8")])
def test_several_gpus_spread_the_sweeps_and_time_the_widest_tp(gpus: int, tp: str) -> None:
    steps = _by_name(bringup.plan(Box(gpus=gpus)))
    assert steps["sweep"].argv[-2:] == ("--gpus", "all") and steps["sweep-sm120"].argv[-2:] == (
        "--gpus",
        "all",
    )
    assert steps["tp"].argv[-2:] == ("--tp", tp) and steps["tp"].skip(Box(gpus=gpus), None) is None


def test_the_steps_run_in_the_documented_order() -> None:
    assert bringup.STEP_NAMES == (
        "box",
        "build", "gpu-tests", "sanitizer", "parity", "sweep", "sweep-sm120", "mma-peak",
        "nvml-lag", "ab-shape-32", "ab-shape-48", "ab-combine", "tp",
    )  # fmt: skip
    for name in bringup.STEP_NAMES:
        assert f"    {name} " in bringup.__doc__, f"{name} is missing from the module's list of steps"


def test_the_shape_ab_runs_only_where_auto_takes_the_mma_sync_configs() -> None:
    step = _by_name(bringup.plan(Box(gpus=1)))["ab-shape-32"]
    assert "probe did not run" in step.skip(Box(gpus=1), None)
    wgmma = {"auto": {"P=4k H=8 T=16": "wgmma-ws", "P=64k H=64 T=16": "wgmma-ws-pipe"}}
    assert step.skip(Box(gpus=1), wgmma) == (
        "auto takes wgmma-ws, wgmma-ws-pipe here, not small/small-m32: the shape rule does not apply"
    )
    assert step.skip(Box(gpus=1), {"auto": {"a": "small", "b": "small-m32"}}) is None


@pytest.mark.parametrize(
    ("only", "skip", "message"),
    [
        ("sweep,nope", None, "--only: unknown step(s) nope; the steps are box, build, gpu-tests"),
        (None, "tp,x,y", "--skip: unknown step(s) x, y; the steps are"),
    ],
)
def test_an_unknown_step_name_is_an_error_naming_the_option(only, skip, message, capsys) -> None:
    assert bringup.main(_args(only=only, skip=skip), box=Box(gpus=1)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("only", "skip", "message"),
    [
        ("parity", "parity", "--only 'parity' --skip 'parity' selects no step"),
        (",", None, "--only '' selects no step"),
        ("", None, "--only '' selects no step"),  # not every step
        (None, ",".join(bringup.STEP_NAMES), "--skip 'box,build,"),
    ],
)
def test_options_that_select_no_step_are_an_error_naming_them(only, skip, message, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    steps = [Step("parity", "stand-in", _py("pass"), 60)]
    rc = bringup.main(
        _args(only=only, skip=skip, out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps
    )
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused_before_any_step(reports, capsys) -> None:
    out = reports / "file"
    out.write_text("not a folder")
    rc = bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=_steps(reports)[:1])
    assert rc == 2
    assert f"--out {out} is a file; expected a folder" in capsys.readouterr().err


def test_only_and_skip_keep_the_plan_order() -> None:
    steps = bringup.select(bringup.plan(Box(gpus=2)), ["tp", "parity", "build"], None)
    assert [s.name for s in steps] == ["build", "parity", "tp"]
    steps = bringup.select(bringup.plan(Box(gpus=2)), None, ["gpu-tests", "sanitizer"])
    assert [s.name for s in steps][:4] == ["box", "build", "parity", "sweep"]


def test_list_prints_every_command_and_runs_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert bringup.main(_args(list=True, out=str(out)), box=Box(gpus=2)) == 0
    text = capsys.readouterr().out
    assert "sweep        python -m harness sweep --grid default --gpus all" in text
    assert f"python -m harness mma-peak --out {out}" in text
    assert "tp           python -m harness sweep --grid default --tp 2\n" in text
    assert "only where auto takes small/small-m32" in text
    assert not out.exists()


def test_a_box_without_a_gpu_skips_every_step_says_why_and_exits_3(tmp_path, capsys) -> None:
    """A CPU build of torch on a GPU box, or an empty CUDA_VISIBLE_DEVICES: nothing was brought
    up, which must not read as success."""
    out = tmp_path / "run"
    assert bringup.main(_args(out=str(out)), box=Box(gpus=0)) == 3
    record = json.loads((out / "bringup.json").read_text())
    assert {s["status"] for s in record["steps"]} == {"skipped"}
    assert {s["reason"] for s in record["steps"]} == {"no CUDA device is visible to torch"}
    assert "nothing brought up: no CUDA device is visible to torch" in capsys.readouterr().err


@pytest.mark.parametrize("name", [".", "reports", "bundles"])
def test_an_out_folder_of_other_files_is_refused_before_anything_is_written(
    tmp_path, capsys, name: str
) -> None:
    """`--out .` would write the record and README.md over the project's own README."""
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    (out / "README.md").write_text("the project's README")
    steps = [Step("box", "stand-in", _py("raise SystemExit('ran')"), 60)]
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 2
    assert "is a folder of other files" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "the project's README"
    assert sorted(p.name for p in out.iterdir()) == ["README.md"]


def test_an_out_name_the_file_system_refuses_exits_2_naming_it(tmp_path, capsys) -> None:
    out = tmp_path / ("a" * 300)
    steps = [Step("box", "stand-in", _py("raise SystemExit('ran')"), 60)]
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 2
    err = capsys.readouterr().err
    assert "error: --out " in err and "File name too long" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Running: stand-in steps


@pytest.fixture()
def reports(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "reports"
    root.mkdir()
    monkeypatch.setattr(bringup, "REPORTS_DIR", root)
    return root


def _steps(reports: Path) -> list[Step]:
    record = reports / "run" / "bringup.json"
    return [
        Step(
            "build",
            "stand-in",
            _py(f'print(\'built\'); print({bringup.PROBE_PREFIX!r} + \'{{"auto": {{"x": "small"}}}}\')'),
            60,
        ),
        Step("gpu-tests", "stand-in", _py("import sys; print('2 failed'); sys.exit(1)"), 60),
        Step(
            "parity",
            "stand-in",
            _py(
                f"import json, pathlib; r = json.loads(pathlib.Path({str(record)!r}).read_text());"
                "print({s['name']: s['status'] for s in r['steps']});"
                f"pathlib.Path({str(reports / '20990101T000000-parity-x-1234567')!r}).mkdir()"
            ),
            60,
        ),
        Step("sweep", "stand-in", _py("import time; time.sleep(30)"), 60),
        Step("ab-shape-32", "stand-in", _py("print('ab')"), 60, bringup._needs_mma_sync_auto),
        Step("tp", "stand-in", _py("print('tp')"), 60, bringup._needs_two_gpus),
    ]


def test_every_step_runs_and_is_recorded_even_after_a_failure(reports, capsys) -> None:
    out = reports / "run"
    rc = bringup.main(
        _args(out=str(out), step_timeout=3),
        box=Box(gpus=1, name="GPU"),
        python=sys.executable,
        steps=_steps(reports),
    )
    assert rc == 1
    record = json.loads((out / "bringup.json").read_text())
    steps = {s["name"]: s for s in record["steps"]}
    assert [s["name"] for s in record["steps"]] == [
        "build",
        "gpu-tests",
        "parity",
        "sweep",
        "ab-shape-32",
        "tp",
    ]
    assert steps["build"]["status"] == "passed" and record["probe"] == {"auto": {"x": "small"}}
    assert steps["gpu-tests"]["status"] == "failed" and steps["gpu-tests"]["rc"] == 1
    assert "2 failed" in (out / "gpu-tests.log").read_text()
    # each step's record is on disk before the next one starts
    assert (
        "{'build': 'passed', 'gpu-tests': 'failed', 'parity': 'not-run'" in (out / "parity.log").read_text()
    )
    assert steps["parity"]["reports"] == ["20990101T000000-parity-x-1234567"]
    assert (
        steps["sweep"]["status"] == "timed-out"
        and steps["sweep"]["reason"] == "stopped after 3 s (--step-timeout)"
    )
    assert steps["ab-shape-32"]["status"] == "passed"  # the probe said auto takes small here
    assert steps["tp"]["status"] == "skipped" and "needs 2 GPUs" in steps["tp"]["reason"]
    readme = (out / "README.md").read_text()
    assert (
        "| gpu-tests | **failed** | 1 |" in readme
        and "`auto` here (the build step's probe): x: small." in readme
    )
    assert "3 passed, 1 failed, 1 timed-out, 1 skipped." in readme
    assert record["command"] == f"python -m harness bringup --out {out} --step-timeout 3"
    assert "bringup: some steps failed" in capsys.readouterr().out


def test_a_failed_build_leaves_the_shape_ab_skipped_with_its_reason(reports) -> None:
    out = reports / "run"
    steps = [Step("build", "stand-in", _py("raise SystemExit(3)"), 60), *_steps(reports)[4:5]]
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 1
    record = json.loads((out / "bringup.json").read_text())
    assert [(s["name"], s["status"], s["rc"]) for s in record["steps"]] == [
        ("build", "failed", 3),
        ("ab-shape-32", "skipped", None),
    ]
    assert record["probe"] is None and "probe did not run" in record["steps"][1]["reason"]


def test_a_second_run_into_the_same_folder_replaces_only_its_steps(reports) -> None:
    out = reports / "run"
    steps = _steps(reports)
    assert (
        bringup.main(_args(out=str(out), skip="sweep"), box=Box(gpus=1), python=sys.executable, steps=steps)
        == 1
    )
    first = json.loads((out / "bringup.json").read_text())
    shutil.rmtree(reports / "20990101T000000-parity-x-1234567")
    rc = bringup.main(_args(out=str(out), only="tp"), box=Box(gpus=2), python=sys.executable, steps=steps)
    assert rc == 0
    second = json.loads((out / "bringup.json").read_text())
    assert second["created_utc"] == first["created_utc"] and second["probe"] == first["probe"]
    old, new = ({s["name"]: s for s in r["steps"]} for r in (first, second))
    assert old["tp"]["status"] == "skipped" and new["tp"]["status"] == "passed"
    assert [new[n] for n in ("build", "gpu-tests", "parity")] == [
        old[n] for n in ("build", "gpu-tests", "parity")
    ]
    assert [c["command"] for c in second["commands"]] == [
        f"python -m harness bringup --skip sweep --out {out}",
        f"python -m harness bringup --only tp --out {out}",
    ]
    readme = (out / "README.md").read_text()
    assert f"- `python -m harness bringup --skip sweep --out {out}`, " in readme
    assert f"- `python -m harness bringup --only tp --out {out}`, " in readme


def test_a_folder_holding_another_record_is_refused(reports, capsys) -> None:
    out = reports / "run"
    out.mkdir()
    (out / "bringup.json").write_text('{"schema": "verify-attention/results"}')
    assert (
        bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=_steps(reports)[:1])
        == 2
    )
    assert "is not a bringup record (schema 'verify-attention/results')" in capsys.readouterr().err
    (out / "bringup.json").write_text("{not json")
    assert (
        bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=_steps(reports)[:1])
        == 2
    )
    assert "bringup.json there is unreadable" in capsys.readouterr().err


def _record(**fields) -> dict:
    base = {"schema": bringup.SCHEMA, "schema_version": bringup.SCHEMA_VERSION, "steps": [], "commands": []}
    return {**base, **fields}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[]", "is not a bringup record (schema 'none: a JSON list')"),
        (b'"x"', "is not a bringup record (schema 'none: a JSON str')"),
        (
            json.dumps(_record(schema_version=99)).encode(),
            "has schema_version 99; this harness reads version 1",
        ),
        (json.dumps(_record(steps=5)).encode(), "is malformed: steps must be a list, got int"),
        (json.dumps(_record(steps=[{"x": 1}])).encode(), "is malformed: steps[0] has no name"),
        (
            json.dumps(_record(steps=[{"name": "box", "status": "passed", "seconds": "long"}])).encode(),
            "is malformed: steps[0] (box): seconds must be a number or null, got 'long'",
        ),
        (
            json.dumps(_record(steps=[{"name": "box", "status": "fine"}])).encode(),
            "is malformed: steps[0] (box): status must be one of passed, ",
        ),
        (json.dumps(_record(commands={"a": 1})).encode(), "is malformed: commands must be a list, got dict"),
        (json.dumps(_record(commands=["x"])).encode(), "is malformed: commands[0] must be an object"),
        (json.dumps(_record(probe=[1])).encode(), "is malformed: probe must be null or an object"),
        (b"\xff\xfe{", "is unreadable ("),
        (None, "is unreadable (Is a directory)"),
    ],
)
def test_a_malformed_record_is_refused_naming_it_before_any_step(reports, capsys, content, message) -> None:
    out = reports / "run"
    out.mkdir()
    if content is None:
        (out / "bringup.json").mkdir()
    else:
        (out / "bringup.json").write_bytes(content)
    steps = [Step("box", "stand-in", _py("raise SystemExit('ran')"), 60)]
    assert (
        bringup.main(_args(out=str(out), only="box"), box=Box(gpus=1), python=sys.executable, steps=steps)
        == 2
    )
    err = capsys.readouterr().err
    assert f"error: --out {out}: bringup.json there {message}" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["bringup.json"]


def test_an_empty_out_is_refused_not_taken_for_the_default(reports, capsys) -> None:
    steps = [Step("box", "stand-in", _py("pass"), 60)]
    assert bringup.main(_args(out=""), box=Box(gpus=1), python=sys.executable, steps=steps) == 2
    assert "error: --out is empty" in capsys.readouterr().err
    assert not list(reports.iterdir())


def test_an_out_holding_a_runs_results_is_refused_before_any_step(reports, capsys) -> None:
    """mma-peak writes into the bring-up's folder and refuses one that holds a run's results."""
    out = reports / "sweep-run"
    out.mkdir()
    (out / "results.json").write_text("a sweep's results")
    steps = [Step("box", "stand-in", _py("raise SystemExit('ran')"), 60)]
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 2
    assert f"--out {out} holds a run's results.json" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["results.json"]


def test_a_resumed_bringup_passes_its_folder_to_mma_peak_which_accepts_it(
    reports, tmp_path, monkeypatch
) -> None:
    """The resumed folder holds the record, logs and the last mma-peak.json, no run's results:
    mma-peak's --out check lets it through."""
    out = reports / "run"
    steps = [Step("box", "stand-in", _py("pass"), 60)]
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 0
    (out / "mma-peak.json").write_text("{}")
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 0
    from harness.box_record import check_no_record
    from harness.cli import check_run_out_dir
    from harness.mma_peak import OUTPUT_FILE

    assert check_run_out_dir(str(out), reports) == out
    check_no_record(str(out), OUTPUT_FILE)  # a bring-up's own mma-peak.json is replaced by its rerun
    (out / "bringup.json").unlink()
    with pytest.raises(ValueError, match="already holds mma-peak.json"):
        check_no_record(str(out), OUTPUT_FILE)  # the same folder without the record: another run's, kept


def test_the_probe_is_the_last_probe_line_of_the_build_log(tmp_path) -> None:
    log = tmp_path / "build.log"
    log.write_text(
        f'built\n{bringup.PROBE_PREFIX}{{bad\n{bringup.PROBE_PREFIX}{{"auto": {{"a": "small"}}}}\ntail\n'
    )
    assert bringup.read_probe(log) == {"auto": {"a": "small"}}
    log.write_text("no probe here\n")
    assert bringup.read_probe(log) is None
    assert bringup.read_probe(tmp_path / "missing.log") is None


def test_the_probe_module_entry_refuses_other_arguments(tmp_path) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "harness.bringup"], capture_output=True, text=True, cwd=bringup.ROOT
    )
    assert done.returncode == 1 and "usage: python -m harness.bringup --box | --probe" in done.stderr


def test_the_cli_lists_the_steps(capsys) -> None:
    from harness.cli import main as cli_main

    assert cli_main(["bringup", "--list", "--only", "build,tp"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("build        python -m harness.bringup --probe")
    assert len(out.splitlines()) == 2
    with pytest.raises(SystemExit):
        cli_main(["bringup", "--step-timeout", "-3"])
    assert "expected a positive number of seconds, got '-3'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# mma-peak


LINE = '{"mode": 1, "acc": 8, "warps_per_cta": 8, "ctas_per_sm": 1, "ms": 1.08, "tflops": 639.2, "of_matmul": 0.818}'


def test_the_microbenchmarks_lines_are_parsed_and_the_best_picked() -> None:
    text = (
        "matmul 781\n"
        + LINE
        + "\n"
        + LINE.replace('"mode": 1', '"mode": 0').replace("639.2", "614.1")
        + "\nrc=0\n"
    )
    runs = mma_peak.parse_runs(text)
    assert [r["mode"] for r in runs] == [1, 0]
    assert mma_peak.best_run(runs).tflops == 639.2 and mma_peak.best_run(runs, 0).tflops == 614.1
    with pytest.raises(mma_peak.MmaPeakError, match="no run of mode 2"):
        mma_peak.best_run(runs, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nothing\n", "printed no result line"),
        ('{"mode": 0,\n', "unreadable result line"),
        ('{"mode": 0, "acc": 4}\n', "lacks warps_per_cta, ctas_per_sm, ms, tflops, of_matmul"),
    ],
)
def test_unusable_output_is_an_error_saying_why(text: str, message: str) -> None:
    with pytest.raises(mma_peak.MmaPeakError, match=message):
        mma_peak.parse_runs(text)


def test_the_arch_comes_from_the_compute_capability() -> None:
    assert mma_peak.arch_of((12, 0)) == "120" and mma_peak.arch_of((9, 0)) == "90"
    with pytest.raises(mma_peak.MmaPeakError, match="compute capability 7.5: mma.sync bf16 needs 8.0"):
        mma_peak.arch_of((7, 5))


def test_a_bad_matmul_rate_is_an_error_naming_the_option(capsys) -> None:
    from harness.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main(["mma-peak", "--matmul-tflops", "zero"])
    assert "--matmul-tflops: expected a positive number of TFLOP/s, got 'zero'" in capsys.readouterr().err


def _fake_gpu(monkeypatch, tmp_path) -> None:
    """mma-peak's main up to the microbenchmark's run, without a GPU: a visible device, a built
    binary, a given matmul rate."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: argparse.Namespace(major=9, minor=0, name="GPU")
    )
    monkeypatch.setattr(mma_peak, "build", lambda arch: tmp_path / "mma_peak")


def test_a_hung_microbenchmark_is_an_error_naming_its_timeout(tmp_path, monkeypatch, capsys) -> None:
    _fake_gpu(monkeypatch, tmp_path)

    def hang(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    args = argparse.Namespace(matmul_tflops=1000.0, out=str(tmp_path / "out"))
    assert mma_peak.main(args) == 1
    err = capsys.readouterr().err
    assert f"error: mma-peak: the microbenchmark ran past its timeout of {mma_peak.RUN_TIMEOUT_S} s" in err
    assert not (tmp_path / "out" / mma_peak.OUTPUT_FILE).exists()


def test_a_hung_nvcc_is_an_error_and_leaves_no_partial_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VERIFY_ATTN_BUILD_DIR", str(tmp_path))

    def hang(argv, **kwargs):
        if "--version" in argv:
            return subprocess.CompletedProcess(argv, 0, "Cuda compilation tools, release 12.8\n", "")
        Path(argv[argv.index("-o") + 1]).write_text("half a binary")
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(mma_peak.MmaPeakError, match=r"nvcc for sm_90 ran past its timeout of 600 s"):
        mma_peak.build("90", nvcc="nvcc")
    assert not list(tmp_path.glob("mma_peak_*/*")) and not list(tmp_path.glob("mma_peak_*/.*"))


def test_mma_peak_refuses_an_out_that_is_a_file_before_building(tmp_path, monkeypatch, capsys) -> None:
    _fake_gpu(monkeypatch, tmp_path)

    def no_build(arch):
        raise AssertionError("built although --out cannot be written")

    monkeypatch.setattr(mma_peak, "build", no_build)
    out = tmp_path / "file"
    out.write_text("not a folder")
    assert mma_peak.main(argparse.Namespace(matmul_tflops=1000.0, out=str(out))) == 2
    assert f"error: mma-peak: --out {out} is a file; expected a folder" in capsys.readouterr().err


@pytest.mark.parametrize("held", ["results.json", "results.json.gz"])
def test_mma_peak_refuses_an_out_holding_a_run_before_building(held, tmp_path, monkeypatch, capsys) -> None:
    _fake_gpu(monkeypatch, tmp_path)

    def no_build(arch):
        raise AssertionError("built although --out holds a run")

    monkeypatch.setattr(mma_peak, "build", no_build)
    out = tmp_path / "run"
    out.mkdir()
    (out / held).write_text("an earlier run")
    assert mma_peak.main(argparse.Namespace(matmul_tflops=1000.0, out=str(out))) == 2
    assert f"error: mma-peak: --out {out} already holds a run ({held})" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == [held]


def test_mma_peak_refuses_an_out_holding_its_record_but_reruns_in_a_bringup_folder(
    tmp_path, monkeypatch, capsys
) -> None:
    """A folder holding mma-peak.json is refused before anything is built (the earlier record
    kept); in a bring-up's folder (bringup.json beside it) the step runs again, as every step of
    a bring-up rerun does."""
    _fake_gpu(monkeypatch, tmp_path)
    built = []

    def no_build(arch):
        built.append(arch)
        raise mma_peak.MmaPeakError("stopped after the --out check")

    monkeypatch.setattr(mma_peak, "build", no_build)
    out = tmp_path / "run"
    out.mkdir()
    (out / "mma-peak.json").write_text("an earlier record")
    assert mma_peak.main(argparse.Namespace(matmul_tflops=1000.0, out=str(out))) == 2
    assert f"error: mma-peak: --out {out} already holds mma-peak.json, which this run would replace" in (
        capsys.readouterr().err
    )
    assert built == [] and (out / "mma-peak.json").read_text() == "an earlier record"
    (out / "bringup.json").write_text("{}")
    assert mma_peak.main(argparse.Namespace(matmul_tflops=1000.0, out=str(out))) == 1
    assert len(built) == 1 and "stopped after the --out check" in capsys.readouterr().err


def test_mma_peak_refuses_an_empty_out(tmp_path, monkeypatch, capsys) -> None:
    _fake_gpu(monkeypatch, tmp_path)
    monkeypatch.setattr(mma_peak, "build", lambda arch: pytest.fail("built although --out is empty"))
    assert mma_peak.main(argparse.Namespace(matmul_tflops=1000.0, out="")) == 2
    assert "error: mma-peak: --out is empty" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "expected"), [("inf", "a finite number"), ("nan", "a positive number")])
def test_a_step_timeout_must_be_finite(value, expected, capsys) -> None:
    from harness.cli import main as cli_main

    with pytest.raises(SystemExit) as exit_:
        cli_main(["bringup", "--list", "--step-timeout", value])
    assert exit_.value.code == 2
    assert (
        f"argument --step-timeout: expected {expected} of seconds, got '{value}'" in capsys.readouterr().err
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_the_microbenchmark_builds_for_sm90_and_sm120_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VERIFY_ATTN_BUILD_DIR", str(tmp_path))
    for arch in ("90", "120"):
        binary = mma_peak.build(arch)
        assert binary.is_file() and "mma_peak_" in binary.parent.name
        stamp = binary.stat().st_mtime_ns
        assert mma_peak.build(arch) == binary and binary.stat().st_mtime_ns == stamp  # cached
    assert len(list(tmp_path.glob("mma_peak_*/mma_peak"))) == 2
    assert not list(tmp_path.glob("mma_peak_*/.mma_peak.*"))  # no partial builds left behind


@pytest.mark.gpu
def test_the_microbenchmark_runs_on_this_gpu(tmp_path, capsys) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from harness.cli import main as cli_main

    assert cli_main(["mma-peak", "--matmul-tflops", "1000", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / mma_peak.OUTPUT_FILE).read_text())
    assert record["schema"] == mma_peak.SCHEMA and record["matmul_source"] == "given (--matmul-tflops)"
    assert len(record["runs"]) == 21 and {r["mode"] for r in record["runs"]} == {0, 1}
    assert all(
        r["tflops"] > 0 and r["of_matmul"] == pytest.approx(r["tflops"] / 1000, abs=1e-3)
        for r in record["runs"]
    )
    assert record["best"]["tflops"] == max(r["tflops"] for r in record["runs"])
    assert "best " in capsys.readouterr().out


def test_a_pytest_step_whose_every_test_skipped_is_skipped_not_passed(reports, tmp_path, capsys) -> None:
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "import pytest\n\ndef test_x():\n    pytest.skip('compute-sanitizer is not on the PATH')\n"
    )
    (tests / "test_b.py").write_text("def test_y():\n    assert True\n")
    pytest_argv = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs")
    steps = [
        Step("sanitizer", "stand-in", (*pytest_argv, str(tests / "test_a.py")), 120),
        Step("gpu-tests", "stand-in", (*pytest_argv, str(tests)), 120),
        Step("sweep", "stand-in", _py("print('progress\\r164 rows, 0 errors -> x/index.html')"), 60),
    ]
    out = reports / "run"
    assert bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps) == 0
    assert "(tests skipped within: gpu-tests)" in capsys.readouterr().out
    record = {s["name"]: s for s in json.loads((out / "bringup.json").read_text())["steps"]}
    sanitizer, gpu_tests = record["sanitizer"], record["gpu-tests"]
    assert sanitizer["status"] == "skipped" and sanitizer["rc"] == 0
    assert sanitizer["summary"].startswith("1 skipped in ")
    assert sanitizer["reason"].startswith("every test skipped (1 skipped in ")
    assert "compute-sanitizer is not on the PATH" in (out / "sanitizer.log").read_text()  # -rs
    assert gpu_tests["status"] == "passed" and gpu_tests["summary"].startswith("1 passed, 1 skipped in ")
    # passed, with what did not run said beside it, not only in the log's last line
    assert gpu_tests["reason"] == "1 test(s) skipped; the log's short summary says why"
    readme = (out / "README.md").read_text()
    assert "(1 test(s) skipped; the log's short summary says why)" in readme
    assert (
        record["sweep"]["summary"] == "164 rows, 0 errors -> x/index.html" and not record["sweep"]["reason"]
    )
    assert "| 164 rows, 0 errors -> x/index.html |" in readme


@pytest.mark.parametrize(
    ("summary", "all_skipped"),
    [
        ("2 skipped in 0.1s", True),
        ("2 skipped, 1 warning in 0.1s", True),
        ("1 passed, 2 skipped in 0.1s", False),
        ("1 failed, 2 skipped in 0.1s", False),
        ("1 error, 2 skipped in 0.1s", False),
        ("142 passed, 1 warning in 177.92s (0:02:57)", False),
        ("no tests ran in 0.01s", False),
    ],
)
def test_all_skipped_reads_pytests_counts(summary: str, all_skipped: bool) -> None:
    assert bringup._all_skipped(summary) is all_skipped


def test_an_interrupted_run_records_the_step_it_stopped_in(reports, monkeypatch) -> None:
    out = reports / "run"
    real = bringup.run_step

    def run_then_interrupt(step, *a, **kw):
        if step.name == "parity":
            raise KeyboardInterrupt
        return real(step, *a, **kw)

    monkeypatch.setattr(bringup, "run_step", run_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=_steps(reports)[:4])
    record = {s["name"]: s for s in json.loads((out / "bringup.json").read_text())["steps"]}
    assert [record[n]["status"] for n in ("build", "gpu-tests", "parity", "sweep")] == [
        "passed",
        "failed",
        "interrupted",
        "not-run",
    ]
    assert "1 interrupted" in (out / "README.md").read_text()


def test_a_resumed_run_stopped_early_keeps_the_earlier_record_of_the_steps_it_did_not_reach(
    reports, monkeypatch
) -> None:
    out = reports / "run"
    steps = _steps(reports)[:4]
    bringup.main(_args(out=str(out), step_timeout=3), box=Box(gpus=1), python=sys.executable, steps=steps)
    first = {s["name"]: s for s in json.loads((out / "bringup.json").read_text())["steps"]}
    assert first["parity"]["status"] == "passed" and first["sweep"]["status"] == "timed-out"

    def interrupt(step, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(bringup, "run_step", interrupt)
    with pytest.raises(KeyboardInterrupt):
        bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps)
    again = {s["name"]: s for s in json.loads((out / "bringup.json").read_text())["steps"]}
    assert again["build"]["status"] == "interrupted"
    # not "not-run": the earlier run's results for them stand, beside their logs
    assert [again[n] for n in ("gpu-tests", "parity", "sweep")] == [
        first[n] for n in ("gpu-tests", "parity", "sweep")
    ]


def test_a_stopped_step_gets_ctrl_c_first_and_cleans_up(tmp_path) -> None:
    """A step's group is in a session of its own (no terminal Ctrl-C reaches it): stop_step sends
    SIGINT so that it cleans up as for a user's Ctrl-C (a sharded sweep stops its workers), and
    SIGKILL only to one that does not end within the grace."""
    cleaned = tmp_path / "cleaned"
    code = (
        "import pathlib, sys, time\n"
        "try:\n    print('ready', flush=True); time.sleep(60)\n"
        f"except KeyboardInterrupt:\n    pathlib.Path({str(cleaned)!r}).write_text('yes'); sys.exit(130)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == b"ready"
    assert bringup.stop_step(proc, grace_s=30) == 130 and cleaned.read_text() == "yes"
    deaf = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == b"ready"
    start = time.monotonic()
    assert bringup.stop_step(proc, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - start < 10


def test_paths_inside_the_checkout_are_shown_relative_to_it(tmp_path, monkeypatch) -> None:
    from harness.cli import REPO_ROOT, shown

    monkeypatch.chdir(REPO_ROOT)
    assert shown(REPO_ROOT / "reports" / "x") == Path("reports/x") and shown("reports/x") == Path("reports/x")
    assert shown(tmp_path / "y") == tmp_path / "y"
    # run from elsewhere, a printed path still names the file from there; a step (run from the
    # root) and the record still get the root-relative or full path
    monkeypatch.chdir(tmp_path)
    assert shown(REPO_ROOT / "reports" / "x") == (REPO_ROOT / "reports" / "x").resolve()
    assert shown(tmp_path / "y") == Path("y")
    step = _by_name(bringup.plan(Box(gpus=1)))["mma-peak"]
    assert bringup.step_argv(step, tmp_path / "bu")[-1] == str((tmp_path / "bu").resolve())
    assert bringup.step_argv(step, REPO_ROOT / "reports" / "r")[-1] == "reports/r"
    monkeypatch.chdir(REPO_ROOT)
    step = _by_name(bringup.plan(Box(gpus=1)))["mma-peak"]
    assert (
        bringup.command_text(step, REPO_ROOT / "reports" / "r")
        == "python -m harness mma-peak --out reports/r"
    )


def test_the_box_step_records_each_nvidia_smi_query(tmp_path, monkeypatch, capsys) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = topo ]; then echo "no topology" >&2; exit 3; fi\necho "GPU 0: stand-in $*"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert bringup._needs_nvidia_smi(Box(gpus=1), None) is None
    assert bringup.describe_box() == 1
    out = capsys.readouterr().out
    assert (
        "$ nvidia-smi -L\nGPU 0: stand-in -L" in out
        and "$ nvidia-smi topo -m\n\nno topology\n(exit 3)" in out
    )
    assert out.rstrip().endswith("box: 3 nvidia-smi queries, one or more failed")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert bringup._needs_nvidia_smi(Box(gpus=1), None) == "nvidia-smi is not on the PATH"


def test_a_step_skipped_on_a_rerun_keeps_the_earlier_outcome_and_each_step_names_its_box(
    reports, monkeypatch
) -> None:
    """TP passed on a box of two GPUs; a rerun of it on a box of one skips it: the record keeps
    the pass (whose log and reports are beside it), and says which box and commit it ran on."""
    out = reports / "run"
    steps = [Step("tp", "stand-in", _py("print('tp: 531 rows, 0 failed')"), 60, bringup._needs_two_gpus)]
    two = Box(gpus=2, name="NVIDIA H200", capability="9.0")
    assert bringup.main(_args(out=str(out)), box=two, python=sys.executable, steps=steps) == 0
    first = json.loads((out / "bringup.json").read_text())["steps"][0]
    assert first["status"] == "passed" and first["gpu"] == "2x NVIDIA H200"
    one = Box(gpus=1, name="NVIDIA RTX PRO 6000", capability="12.0")
    assert bringup.main(_args(out=str(out)), box=one, python=sys.executable, steps=steps) == 0
    record = json.loads((out / "bringup.json").read_text())
    assert record["steps"] == [first]
    assert [c["gpu"] for c in record["commands"]] == ["2x NVIDIA H200", "1x NVIDIA RTX PRO 6000"]
    readme = (out / "README.md").read_text()
    assert f"[run at {first['commit']} on 2x NVIDIA H200]" in readme


def test_a_sigterm_stops_the_running_step_and_records_it(reports) -> None:
    """nox or a job system stops a run with SIGTERM, a closed terminal with SIGHUP: the step is
    stopped as for Ctrl-C and the record says so, instead of the step left running unrecorded."""
    out = reports / "run"
    started = reports / "started"
    code = (
        "import os, pathlib, signal, time\n"
        f"pathlib.Path({str(started)!r}).write_text('x')\n"
        "os.kill(os.getppid(), signal.SIGTERM)\n"
        "time.sleep(60)\n"
    )
    steps = [Step("sweep", "stand-in", _py(code), 120)]
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        bringup.main(_args(out=str(out)), box=Box(gpus=1), python=sys.executable, steps=steps)
    assert time.monotonic() - start < 30 and started.exists()
    step = json.loads((out / "bringup.json").read_text())["steps"][0]
    assert step["status"] == "interrupted" and step["reason"] == "stopped by a SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
