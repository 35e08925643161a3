"""results.json's field types: a file that loads has the types the report and compare read, and
every committed run loads.

Each case below takes a committed test file (tests/data) and gives one field a wrong type; the
reader must refuse it with a ResultsError naming the file and the field, where before the report
or compare failed later with a traceback (or, for ``notes``, read a string as a list of letters).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main as cli_main
from harness.results import (
    PARITY_ROW_TYPES,
    REPORTS_DIR,
    SWEEP_ROW_TYPES,
    ParityRow,
    ResultsError,
    SweepRow,
    load_results,
    results_files_under,
)

DATA = Path(__file__).parent / "data"
SWEEP = DATA / "sweep-h200" / "results.json"
PARITY = DATA / "parity-cpu" / "results.json"
SWEEP_ROW3 = "sweep[3] (B1-P4096-T16-H8-shuffled sglang-triton-ps1 graph)"
SWEEP_ROW0 = "sweep[0] (B1-P4096-T16-H8-shuffled verify-attn-cuda cold)"


def _set(*path: Any, value: Any) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return edit


# (id, source file, edit, the error after the file name)
WRONG_TYPES = [
    ("environment-null", SWEEP, _set("environment", value=None), "environment must be an object, got None"),
    ("git-string", SWEEP, _set("git", value="abc"), "git must be an object, got 'abc'"),
    ("git-sha-number", SWEEP, _set("git", "sha", value=7), "git.sha must be a string or null, got 7"),
    (
        "gpu-string",
        SWEEP,
        _set("environment", "gpu", value="H200"),
        "environment.gpu must be an object or null, got 'H200'",
    ),
    ("created-utc-number", SWEEP, _set("created_utc", value=5), "created_utc must be a string, got 5"),
    ("command-list", SWEEP, _set("command", value=["a"]), "command must be a string, got ['a']"),
    ("notes-string", SWEEP, _set("notes", value="a note"), "notes must be a list of strings, got 'a note'"),
    ("notes-item-number", SWEEP, _set("notes", value=["a", 5]), "notes[1] must be a string, got 5"),
    (
        "kind-unknown",
        SWEEP,
        _set("kind", value="banana"),
        "kind must be one of 'sweep', 'parity', 'ab', got 'banana'",
    ),
    (
        "sweep-status-unknown",
        SWEEP,
        _set("sweep", 3, "status", value="banana"),
        f"{SWEEP_ROW3}: status must be one of 'ok', 'error', got 'banana'",
    ),
    (
        "parity-status-unknown",
        PARITY,
        _set("parity", 0, "status", value="passed"),
        "parity[0] (smoke-p1000-chain4 oracle): status must be one of 'pass', 'fail', 'error', 'unavailable', got 'passed'",
    ),
    (
        "ceilings-bandwidth-string",
        SWEEP,
        _set("ceilings", "copy_bandwidth_gbs", value="x"),
        "ceilings.copy_bandwidth_gbs must be a number, got 'x'",
    ),
    ("ceilings-list", SWEEP, _set("ceilings", value=[1]), "ceilings must be an object or null, got [1]"),
    (
        "unavailable-without-reason",
        PARITY,
        _set("unavailable", value=[{"impl": "x"}]),
        "unavailable[0] has no 'reason'; expected a string",
    ),
    (
        "unavailable-item-string",
        PARITY,
        _set("unavailable", value=["x"]),
        "unavailable[0] must be an object, got 'x'",
    ),
    ("sweep-object", SWEEP, _set("sweep", value={}), "sweep must be a list of sweep rows, got {}"),
    ("sweep-row-number", SWEEP, _set("sweep", 2, value=5), "sweep[2] must be an object, got 5"),
    (
        "samples-string",
        SWEEP,
        _set("sweep", 3, "samples_ms", value="abc"),
        f"{SWEEP_ROW3}: samples_ms must be a list of numbers, got 'abc'",
    ),
    (
        "samples-item-string",
        SWEEP,
        _set("sweep", 3, "samples_ms", 2, value="x"),
        f"{SWEEP_ROW3}: samples_ms[2] must be a number, got 'x'",
    ),
    (
        "median-nan",
        SWEEP,
        _set("sweep", 3, "median_ms", value=float("nan")),
        f"{SWEEP_ROW3}: median_ms must be a number, got nan",
    ),
    (
        "floor-string",
        SWEEP,
        _set("sweep", 0, "floor_ms", value="x"),
        f"{SWEEP_ROW0}: floor_ms must be a number or null, got 'x'",
    ),
    (
        "prefix-len-string",
        SWEEP,
        _set("sweep", 0, "params", "prefix_len", value="big"),
        f"{SWEEP_ROW0}: params.prefix_len must be an integer, got 'big'",
    ),
    (
        "speedup-string-value",
        SWEEP,
        _set("sweep", 0, "speedup", value={"oracle": "2x"}),
        f"{SWEEP_ROW0}: speedup must be an object of numbers, got {{'oracle': '2x'}}",
    ),
    (
        "throttled-string",
        SWEEP,
        _set("sweep", 0, "throttled", value="no"),
        f"{SWEEP_ROW0}: throttled must be true or false, got 'no'",
    ),
    (
        "throttled-samples-strings",
        SWEEP,
        _set("sweep", 0, "throttled_samples", value=["1"]),
        f"{SWEEP_ROW0}: throttled_samples[0] must be an integer, got '1'",
    ),
    (
        "bytes-float",
        SWEEP,
        _set("sweep", 0, "bytes", value=1.5),
        f"{SWEEP_ROW0}: bytes must be an integer, got 1.5",
    ),
    (
        "max-rel-err-string",
        PARITY,
        _set("parity", 0, "max_rel_err", value="x"),
        "parity[0] (smoke-p1000-chain4 oracle): max_rel_err must be a number or null, got 'x'",
    ),
    (
        "num-rows-bool",
        PARITY,
        _set("parity", 0, "num_rows", value=True),
        "parity[0] (smoke-p1000-chain4 oracle): num_rows must be an integer, got True",
    ),
]


def _write(tmp_path: Path, source: Path, edit: Callable[[dict], None]) -> Path:
    doc = json.loads(source.read_text())
    edit(doc)
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("source", "edit", "message"), [c[1:] for c in WRONG_TYPES], ids=[c[0] for c in WRONG_TYPES]
)
def test_a_wrongly_typed_field_is_an_error_naming_the_file_and_the_field(
    tmp_path: Path, source: Path, edit: Callable[[dict], None], message: str
) -> None:
    path = _write(tmp_path, source, edit)
    with pytest.raises(ResultsError) as e:
        load_results(path)
    assert str(e.value) == f"{path}: {message}"


def test_report_of_a_wrongly_typed_run_is_an_error_not_a_traceback(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, SWEEP, _set("environment", value=None))
    assert cli_main(["report", str(path)]) == 2
    assert f"error: {path}: environment must be an object, got None" in capsys.readouterr().err
    assert not (path.parent / "index.html").exists()


def test_compare_of_a_wrongly_typed_run_is_an_error_not_a_traceback(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, SWEEP, _set("sweep", 3, "samples_ms", value="abc"))
    assert cli_main(["compare", str(path), str(SWEEP), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"compare: {path}: {SWEEP_ROW3}: samples_ms must be a list of numbers" in err


@pytest.mark.parametrize(("row", "types"), [(ParityRow, PARITY_ROW_TYPES), (SweepRow, SWEEP_ROW_TYPES)])
def test_every_row_field_has_a_checked_type(row: type, types: dict) -> None:
    assert sorted(types) == sorted(f.name for f in fields(row))


def test_every_committed_results_file_loads() -> None:
    files = results_files_under(REPORTS_DIR) + results_files_under(DATA)
    assert files
    for path in files:
        load_results(path)


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("corrupt-gzip", None, "not a readable results file"),
        ("huge-integer", b'{"schema": ' + b"9" * 5000 + b"}", "not valid JSON"),
        ("deep-nesting", b"[" * 100_000, "not valid JSON"),
    ],
)
def test_a_damaged_results_file_is_an_error_naming_it_not_a_traceback(
    tmp_path: Path, capsys, name: str, data: bytes | None, message: str
) -> None:
    if data is None:  # a compressed run with bytes flipped in the middle of its stream
        raw = bytearray(gzip.compress(SWEEP.read_bytes()))
        raw[100:200] = bytes(b ^ 0xFF for b in raw[100:200])
        data = bytes(raw)
    path = tmp_path / "run" / ("results.json.gz" if name == "corrupt-gzip" else "results.json")
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(ResultsError, match=message):
        load_results(path)
    assert cli_main(["report", str(path)]) == 2
    assert f"error: {path}: {message}" in capsys.readouterr().err


def test_schema_version_true_is_not_version_1(tmp_path: Path) -> None:
    path = _write(tmp_path, SWEEP, _set("schema_version", value=True))
    with pytest.raises(ResultsError, match="'schema_version' is True, this reader handles 1"):
        load_results(path)


def test_a_sweep_row_without_the_case_params_is_an_error_naming_the_param(tmp_path: Path) -> None:
    # Tables, plots and fits key on them: a file without them would load and then fail to render.
    path = _write(tmp_path, SWEEP, _set("sweep", 0, "params", value={}))
    with pytest.raises(
        ResultsError, match=r"sweep\[0\] \(.*\): params has no 'batch_size'; expected an integer"
    ):
        load_results(path)


def test_a_run_of_tensor_parallel_rank_rows_only_renders(tmp_path: Path) -> None:
    def ranks_only(doc: dict) -> None:
        for i, row in enumerate(doc["sweep"]):
            row["tp_rank"], row["tp_size"] = i % 2, 2

    path = _write(tmp_path, SWEEP, ranks_only)
    assert cli_main(["report", str(path)]) == 0
    assert (path.parent / "index.html").is_file()


def test_a_record_that_cannot_be_written_where_asked_is_kept_elsewhere_or_said_lost(
    tmp_path: Path, monkeypatch
) -> None:
    """mma-peak's and nvml-lag's records (harness.results.write_or_keep): written atomically, or
    kept in a folder of their own with the error naming both places, or an error saying neither
    could be written; never a traceback that loses the run."""
    import harness.results as results

    out = tmp_path / "run" / "nvml-lag.json"
    assert results.write_or_keep(out, "{}\n") == "" and out.read_text() == "{}\n"
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    kept_in = tmp_path / "kept"
    monkeypatch.setattr(results, "unwritten_path", lambda name: kept_in / name)
    said = results.write_or_keep(blocked / "nvml-lag.json", '{"a": 1}\n')
    assert said.startswith(f"{blocked / 'nvml-lag.json'}: not written (")
    assert said.endswith(f"the record is kept in {kept_in / 'nvml-lag.json'}")
    assert (kept_in / "nvml-lag.json").read_text() == '{"a": 1}\n'
    monkeypatch.setattr(results, "unwritten_path", lambda name: blocked / "kept" / name)
    said = results.write_or_keep(blocked / "nvml-lag.json", "{}\n")
    assert "not written (" in said and "nor could the record be kept elsewhere (" in said
