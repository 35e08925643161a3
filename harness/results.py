"""results.json: one versioned schema for parity, sweep and A/B runs (DESIGN.md section 6).

Data flows one way: runs produce rows, rows go into a :class:`Results`, which is written
atomically (temp file + rename) and later read by the report and compare steps.

Top-level layout (``schema_version`` 1)::

    schema            "verify-attention/results"
    schema_version    1
    kind              "parity" | "sweep" | "ab"
    created_utc       ISO-8601 time of the run
    command           the command line that produced it
    git               {sha, dirty, describe}
    environment       {gpu: {...} | null, python, platform, torch, cuda, triton, sglang, build_flags}
    ceilings          {copy_bandwidth_gbs, bf16_tflops, method, ..., empty_kernel_ms} | null  (measured in the same run)
    parity            [ParityRow ...]
    sweep             [SweepRow ...]
    unavailable       [{impl, reason}]
    notes             [str ...]

A sweep row's ``impl_config`` (added within version 1, "" when absent) names what the
implementation ran for the case, where it says: the kernel's tile config.

Reading checks the type of every field the report and compare read (:func:`check_types`), so a
file that loads can be shown and compared; a wrong type is a ResultsError naming the file and
the field, not a traceback from deep inside a table, a plot or a statistic.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import math
import os
import re
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

SCHEMA = "verify-attention/results"
SCHEMA_VERSION = 1


class ResultsError(ValueError):
    """A results.json that cannot be used: wrong schema, wrong version, truncated, malformed."""


@dataclass(frozen=True)
class ParityRow:
    bundle: str
    impl: str
    status: str  # "pass" | "fail" | "unavailable" | "error"
    reason: str = ""  # why it failed or could not run ("" on pass)
    max_rel_err: float | None = None  # max over (token, head) rows of ||out-ref|| / ||ref||
    min_cosine: float | None = None
    max_lse_abs_err: float | None = None  # None when the implementation returns no lse
    tokens_match: bool | None = None  # target tokens equal the golden ones
    path_match: bool | None = None  # accepted path equals the golden one
    num_rows: int = 0
    worst_row: str = ""  # "token 3, head 5" of the largest relative error
    run_time_s: float | None = None


@dataclass(frozen=True)
class SweepRow:
    case_id: str  # readable id, e.g. "B1-P65536-T16-H8-shuffled"
    impl: str
    params: dict[str, Any]  # batch_size, prefix_len, num_heads, tree_size, layout, ...
    mode: str  # "cold" (L2 flushed/rotated) | "graph" (CUDA-graph replay)
    samples_ms: list[float]
    median_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    bytes: int
    flops: int
    floor_ms: float | None = None
    pct_of_floor: float | None = None  # 100 * floor / median
    bandwidth_gbs: float | None = None
    tflops: float | None = None
    speedup: dict[str, float] = field(default_factory=dict)  # over other impls, same case+mode
    nvml_before: dict[str, Any] | None = None
    nvml_after: dict[str, Any] | None = None
    throttled: bool = False
    throttle_reasons: list[str] = field(default_factory=list)
    # Indices into samples_ms of the samples NVML's readings around them show capped
    # (harness.nvml.flag_samples); None where they were not read per sample (no NVML, a TP row,
    # the CPU, a run from before they were)
    throttled_samples: list[int] | None = None
    # The SM clock (MHz) under which a reading counted as lowered when those samples were
    # flagged (harness.nvml.clock_line); None where a cap alone flagged them (no clock read, or a
    # run from before the flags asked for a lowered clock)
    throttle_clock_line_mhz: float | None = None
    note: str = ""  # e.g. "fewer samples: slow implementation"; the error when status is "error"
    repro: str = ""  # a command that re-times this case alone
    # "ok" | "error": an error row (the call raised, or its output had NaN/Inf) has no samples and
    # zero statistics; it is never timed
    status: str = "ok"
    cold_l2: str = ""  # how L2 was made cold: "flush 120 MB", "rotate 7 input sets"
    # Where it ran, in runs over several GPUs (harness/shard.py); None in single-GPU runs and
    # on a TP step row, which spans every rank's GPU. gpu_index numbers the GPUs as the run's
    # parent process saw them.
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    # Tensor-parallel runs: tp_size GPUs each time H/tp_size heads; tp_rank is the rank of a
    # rank row and None on the step row (the slowest rank per round)
    tp_rank: int | None = None
    tp_size: int | None = None
    # What the implementation ran for this case where it says (the kernel: its tile config, e.g.
    # "wgmma-ws" or, on sm_120, "small" / "small-m32" chosen per call); "" where it does not.
    impl_config: str = ""

    @property
    def timed(self) -> bool:
        """A row with samples to show: not an error row, and not a side that could not run."""
        return self.status == "ok" and bool(self.samples_ms) and self.median_ms > 0

    @property
    def capped_count(self) -> str | None:
        """``"12/40"``: how many of the row's samples were flagged capped, of how many; None where
        they were not read one by one (``throttled_samples`` is None)."""
        if self.throttled_samples is None:
            return None
        return f"{len(self.throttled_samples)}/{len(self.samples_ms)}"


# ---------------------------------------------------------------------------------------------
# Field types: what the report and compare read each field as. Checked where a field is present;
# a row's missing fields take the dataclass defaults (or fail its constructor when required).


@dataclass(frozen=True)
class FieldType:
    """What a field holds: ``check`` on the value, then for a list ``items`` on each item, and for
    an object ``fields`` on those it has (``required``: those it must have)."""

    expected: str  # for the error: "a string", "a list of numbers"
    check: Callable[[Any], bool]
    items: FieldType | None = None
    fields: Mapping[str, FieldType] = field(default_factory=dict)
    required: tuple[str, ...] = ()


def _is_number(x: Any) -> bool:
    """An int or a finite float, not a bool (JSON's NaN and Infinity are not results)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _or_null(t: FieldType) -> FieldType:
    return replace(t, expected=f"{t.expected} or null", check=lambda v: v is None or t.check(v))


def _list(items: FieldType, expected: str) -> FieldType:
    return FieldType(expected, lambda v: isinstance(v, list), items=items)


def _object(fields: Mapping[str, FieldType], required: tuple[str, ...] = ()) -> FieldType:
    return FieldType("an object", lambda v: isinstance(v, dict), fields=fields, required=required)


STRING = FieldType("a string", lambda v: isinstance(v, str))


def _one_of(*values: str) -> FieldType:
    """A string among ``values``: a value no writer makes would be shown or compared as-is."""
    return FieldType(f"one of {', '.join(map(repr, values))}", lambda v: v in values)


INTEGER = FieldType("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = FieldType("a number", _is_number)
BOOLEAN = FieldType("true or false", lambda v: isinstance(v, bool))
OBJECT = _object({})

PARITY_ROW_TYPES: dict[str, FieldType] = {
    "bundle": STRING,
    "impl": STRING,
    "status": _one_of("pass", "fail", "error", "unavailable"),
    "reason": STRING,
    "max_rel_err": _or_null(NUMBER),
    "min_cosine": _or_null(NUMBER),
    "max_lse_abs_err": _or_null(NUMBER),
    "tokens_match": _or_null(BOOLEAN),
    "path_match": _or_null(BOOLEAN),
    "num_rows": INTEGER,
    "worst_row": STRING,
    "run_time_s": _or_null(NUMBER),
}

# The params the report sorts cases and splits plots by, and an A/B side's ``impl``; a run may
# record others, of any type.
SWEEP_PARAMS_TYPES: dict[str, FieldType] = {
    "batch_size": INTEGER,
    "prefix_len": INTEGER,
    "num_heads": INTEGER,
    "tree_size": INTEGER,
    "seed": INTEGER,
    "layout": STRING,
    "tree": STRING,
    "impl": STRING,
}

SWEEP_PARAMS_REQUIRED = ("batch_size", "prefix_len", "num_heads", "tree_size", "layout", "tree")

SWEEP_ROW_TYPES: dict[str, FieldType] = {
    "case_id": STRING,
    "impl": STRING,
    # The params every grid case has (harness/cases.py), which tables, plots and fits key on.
    "params": _object(SWEEP_PARAMS_TYPES, required=SWEEP_PARAMS_REQUIRED),
    "mode": _one_of("cold", "graph"),
    "samples_ms": _list(NUMBER, "a list of numbers"),
    "median_ms": NUMBER,
    "iqr_ms": NUMBER,
    "min_ms": NUMBER,
    "max_ms": NUMBER,
    "bytes": INTEGER,
    "flops": INTEGER,
    "floor_ms": _or_null(NUMBER),
    "pct_of_floor": _or_null(NUMBER),
    "bandwidth_gbs": _or_null(NUMBER),
    "tflops": _or_null(NUMBER),
    "speedup": replace(
        OBJECT,
        expected="an object of numbers",
        check=lambda v: isinstance(v, dict) and all(map(_is_number, v.values())),
    ),
    "nvml_before": _or_null(OBJECT),
    "nvml_after": _or_null(OBJECT),
    "throttled": BOOLEAN,
    "throttle_reasons": _list(STRING, "a list of strings"),
    "throttled_samples": _or_null(_list(INTEGER, "a list of sample indices")),
    "throttle_clock_line_mhz": _or_null(NUMBER),
    "note": STRING,
    "repro": STRING,
    "status": _one_of("ok", "error"),
    "cold_l2": STRING,
    "gpu_index": _or_null(INTEGER),
    "gpu_uuid": _or_null(STRING),
    "tp_rank": _or_null(INTEGER),
    "tp_size": _or_null(INTEGER),
    "impl_config": STRING,
}

# Rows are checked apart (check_types), so that an error names the row by its case or bundle.
RESULTS_TYPES: dict[str, FieldType] = {
    "kind": _one_of("sweep", "parity", "ab"),
    "created_utc": STRING,
    "command": STRING,
    "git": _object({"sha": _or_null(STRING), "dirty": _or_null(BOOLEAN), "describe": _or_null(STRING)}),
    "environment": _object({"gpu": _or_null(_object({"name": _or_null(STRING)}))}),
    "ceilings": _or_null(
        _object(
            {
                "copy_bandwidth_gbs": NUMBER,
                "bf16_tflops": NUMBER,
                "empty_kernel_ms": NUMBER,
                "copy_median_ms": NUMBER,
                "matmul_median_ms": NUMBER,
                "copy_bytes": INTEGER,
                "matmul_n": INTEGER,
                "method": STRING,
            }
        )
    ),
    "parity": _list(OBJECT, "a list of parity rows"),
    "sweep": _list(OBJECT, "a list of sweep rows"),
    "unavailable": _list(
        _object({"impl": STRING, "reason": STRING}, required=("impl", "reason")), "a list of {impl, reason}"
    ),
    "notes": _list(STRING, "a list of strings"),
}


def _check(value: Any, t: FieldType, where: str, path: str) -> None:
    if not t.check(value):
        raise ResultsError(f"{where}: {path} must be {t.expected}, got {value!r:.80}")
    if value is None:
        return
    if t.items is not None:
        for i, item in enumerate(value):
            _check(item, t.items, where, f"{path}[{i}]")
    for name in t.required:
        if name not in value:
            raise ResultsError(f"{where}: {path} has no {name!r}; expected {t.fields[name].expected}")
    _check_fields(value, t.fields, where, f"{path}.")


def _check_fields(obj: dict[str, Any], types: Mapping[str, FieldType], where: str, prefix: str = "") -> None:
    for name, t in types.items():
        if name in obj:
            _check(obj[name], t, where, prefix + name)


def check_types(doc: dict[str, Any], source: str) -> None:
    """Raise ResultsError naming ``source`` and the field (``environment.gpu``, ``sweep[3]
    (<case> <impl> <mode>): samples_ms``) where results.json's object ``doc`` holds a value of a
    type the report or compare cannot read (the tables above)."""
    _check_fields(doc, RESULTS_TYPES, source)
    for key, types, ids in (
        ("parity", PARITY_ROW_TYPES, ("bundle", "impl")),
        ("sweep", SWEEP_ROW_TYPES, ("case_id", "impl", "mode")),
    ):
        for i, row in enumerate(doc.get(key, [])):
            _check_fields(row, types, f"{source}: {key}[{i}] ({' '.join(str(row.get(k)) for k in ids)})")


@dataclass
class Results:
    kind: str
    created_utc: str
    command: str
    git: dict[str, Any]
    environment: dict[str, Any]
    ceilings: dict[str, Any] | None = None
    parity: list[ParityRow] = field(default_factory=list)
    sweep: list[SweepRow] = field(default_factory=list)
    unavailable: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **d}

    @classmethod
    def from_json(cls, d: Any, source: str = "results.json") -> Results:
        if not isinstance(d, dict):
            raise ResultsError(f"{source}: expected a JSON object at the top level, got {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise ResultsError(f"{source}: 'schema' is {d.get('schema')!r}, expected {SCHEMA!r}")
        version = d.get("schema_version")
        if type(version) is not int or version != SCHEMA_VERSION:  # true == 1 in Python
            raise ResultsError(
                f"{source}: 'schema_version' is {version!r}, this reader handles {SCHEMA_VERSION}"
            )
        for key in ("kind", "created_utc", "command", "git", "environment"):
            if key not in d:
                raise ResultsError(f"{source}: missing required field {key!r}")
        check_types(d, source)
        try:
            parity = [ParityRow(**r) for r in d.get("parity", [])]
            sweep = [SweepRow(**r) for r in d.get("sweep", [])]
        except TypeError as e:
            raise ResultsError(f"{source}: a parity or sweep row has unexpected fields: {e}") from e
        return cls(
            kind=d["kind"],
            created_utc=d["created_utc"],
            command=d["command"],
            git=d["git"],
            environment=d["environment"],
            ceilings=d.get("ceilings"),
            parity=parity,
            sweep=sweep,
            unavailable=list(d.get("unavailable", [])),
            notes=list(d.get("notes", [])),
        )


REPORTS_DIR = Path(__file__).resolve().parent.parent / "reports"


def run_folder(kind: str, gpu_name: str | None, sha: str | None, now: Any) -> Path:
    """``reports/<UTC yyyymmddTHHMMSS>-<kind>-<gpu slug, or cpu>-<sha7, or nogit>``."""
    where = re.sub(r"[^a-z0-9]+", "-", (gpu_name or "cpu").lower()).strip("-")
    return REPORTS_DIR / f"{now:%Y%m%dT%H%M%S}-{kind}-{where}-{(sha or 'nogit')[:7]}"


def unwritten_path(name: str) -> Path:
    """Where a record that could not be written where asked is kept instead: ``name`` in a new
    folder of its own under the system's temporary directory."""
    return Path(tempfile.mkdtemp(prefix="verify-attention-unwritten-")) / name


def kept_elsewhere(results: Results, why: str) -> str:
    """``why`` a run could not be written where asked, with where its results are kept instead
    (:func:`unwritten_path`), so that a disk that filled up (or a folder made read-only) during a
    long run does not cost the measurements."""
    try:
        kept = unwritten_path(RESULTS_FILE)
        write_results(results, kept)
    except OSError as e:
        return f"{why}; nor could its results be kept elsewhere ({e.strerror or e})"
    return f"{why}; its results are kept in {kept} (render it there with `python -m harness report`)"


def write_or_keep(path: Path, text: str) -> str:
    """Write a command's record ``text`` to ``path`` atomically; "" when written, else the error
    line to print: why not, and where the record is kept instead (:func:`unwritten_path`), or
    that it could not be kept either."""
    try:
        atomic_write_text(path, text)
        return ""
    except OSError as e:
        why = f"{path}: not written ({e.strerror or e})"
    try:
        kept = unwritten_path(path.name)
        atomic_write_text(kept, text)
    except OSError as e:
        return f"{why}; nor could the record be kept elsewhere ({e.strerror or e})"
    return f"{why}; the record is kept in {kept}"


def keep_and_raise(
    results: Results, e: BaseException, what: str, error: type[Exception] = ResultsError
) -> NoReturn:
    """Keep ``results`` elsewhere (:func:`kept_elsewhere`) and raise: an error as ``error`` that
    says ``what`` failed and where the results are; Ctrl-C (or an exit) as it came, after a line
    on stderr that says so."""
    if isinstance(e, OSError):
        detail = e.strerror or str(e)
    else:
        detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    note = kept_elsewhere(results, f"{what} ({detail})")
    if isinstance(e, Exception):
        raise error(note) from e
    print(f"the report was not written: {note}", file=sys.stderr)
    raise e


def atomic_write_text(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` so that a crash leaves either the old file or the new one
    (``exclusive``: see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"), exclusive=exclusive)


def atomic_write_bytes(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one.
    ``exclusive``: never replace a file; FileExistsError when ``path`` exists, also when another
    process made it meanwhile (the whole file is linked into place, so it appears complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a report is meant to be read by others
        if exclusive:
            _link_new(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Make the folder's new entry durable (a rename is a change of the folder): so that a later
    step that relies on it, such as prune deleting results.json once its .gz is in place, cannot
    outlive it across a power cut. Where the system cannot sync a folder, nothing."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _link_new(tmp: str, path: Path) -> None:
    """``tmp``'s file also at ``path``, which must not exist (FileExistsError). Where the file
    system has no hard links, the check and a rename: exclusive except against a process that
    makes ``path`` in between."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if path.exists() or path.is_symlink():
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)


def results_text(doc: dict) -> str:
    """results.json's text: one top-level key a line, and a list of rows (sweep, parity) one row a
    line, each compact. A row's 200 samples then take one line, not 200: reports travel with the
    tracked tree, which has a size limit, and a diff between two runs still reads row by row."""

    def compact(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)

    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            rows = ",\n".join("  " + compact(v) for v in value)
            lines.append(f" {compact(key)}: [\n{rows}\n ]")
        else:
            lines.append(f" {compact(key)}: {compact(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_results(results: Results, path: Path, *, exclusive: bool = False) -> None:
    atomic_write_bytes(Path(path), results_text(results.to_json()).encode("utf-8"), exclusive=exclusive)


# A run's results file as written, and as an older run keeps it once its page is pruned
# (`report --prune` compresses it: the tracked tree, reports included, has a size limit).
RESULTS_FILE = "results.json"
RESULTS_GZ = RESULTS_FILE + ".gz"
GZIP_MAGIC = b"\x1f\x8b"


def is_results_file(path: str | Path) -> bool:
    """``path`` names a run's results file, plain or compressed."""
    return Path(path).name in (RESULTS_FILE, RESULTS_GZ)


def results_in(folder: Path) -> Path:
    """The results file of a run folder: ``results.json``, else ``results.json.gz``."""
    folder = Path(folder)
    plain = folder / RESULTS_FILE
    return plain if plain.exists() or not (folder / RESULTS_GZ).exists() else folder / RESULTS_GZ


def one_per_run(paths: Iterable[Path]) -> list[Path]:
    """Results files, sorted, one per run folder: where a folder holds both forms (a prune cut
    short between writing the compressed file and removing the plain one) the plain one."""
    chosen: dict[Path, Path] = {}
    for p in map(Path, paths):
        if p.parent not in chosen or p.name == RESULTS_FILE:
            chosen[p.parent] = p
    return sorted(chosen.values())


def results_files_under(folder: Path) -> list[Path]:
    """Every run's results file below ``folder`` (plain or compressed, one per run), sorted."""
    return one_per_run(p for p in Path(folder).rglob(f"{RESULTS_FILE}*") if is_results_file(p))


def results_from_bytes(data: bytes, source: str) -> Results:
    """A results file's bytes (gzip-compressed or not) as Results; ``source`` names it in errors."""
    try:
        text = (gzip.decompress(data) if data[:2] == GZIP_MAGIC else data).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise ResultsError(f"{source}: not a readable results file (truncated or corrupt?): {e}") from e
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError; so are huge ints
        raise ResultsError(f"{source}: not valid JSON (truncated or corrupt?): {e}") from e
    return Results.from_json(d, source=source)


def load_results(path: Path) -> Results:
    path = Path(path)
    if path.is_dir():
        path = results_in(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise ResultsError(f"{path}: no such results file") from e
    except OSError as e:
        raise ResultsError(f"{path}: cannot read the results file: {e.strerror or e}") from e
    return results_from_bytes(data, str(path))


def compress_results(path: Path) -> Path:
    """``results.json`` -> ``results.json.gz`` beside it (the same text, gzip level 9, no
    timestamp: the same file gives the same bytes). The compressed file is complete on disk before
    the plain one goes; returns its path."""
    path = Path(path)
    gz = path.with_name(RESULTS_GZ)
    atomic_write_bytes(gz, gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))
    path.unlink()
    return gz
