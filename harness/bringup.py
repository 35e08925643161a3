"""``python -m harness bringup``: the first run on a new box, every step in one command.

A box the kernel has never run on (the first is an RTX PRO 6000, sm_120) needs the same evidence
every time: the GPU tests, parity with the mutation controls, the default sweep on every GPU,
the sm_120 configs' own grid, mma.sync's ceiling, the A/Bs of the choices made elsewhere, and
the tensor-parallel steps. Each step is one of the project's own commands, run as a child
process in this order:

    box          nvidia-smi: the GPUs, the driver and clocks, how the GPUs are linked (topo -m)
    build        the kernel extension, and the configs ``auto`` takes here (a probe, no timing)
    gpu-tests    pytest -m gpu tests (the sanitizer tests apart; -n 8 where pytest-xdist is)
    sanitizer    pytest -m gpu tests/test_kernel_sanitizer.py (compute-sanitizer memcheck, racecheck)
    parity       python -m harness parity --mutations
    sweep        python -m harness sweep --grid default [--gpus all]
    sweep-sm120  python -m harness sweep --grid sm120 [--gpus all]   (sm_120's configs, forced)
    mma-peak     python -m harness mma-peak --out <this run's folder>
    nvml-lag     python -m harness nvml-lag --out <this run's folder>   (how late NVML reports a cap)
    ab-shape-32  python -m harness ab --base-define VA_SMALL_SHAPE=32 --grid default
    ab-shape-48  python -m harness ab --base-define VA_SMALL_SHAPE=48 --grid quick
    ab-combine   python -m harness ab --base-define VA_COMBINE_TWO_PASS --grid quick
    tp           python -m harness sweep --grid default --tp N   (N: 8, 4 or 2, the most GPUs here)

``--gpus all`` where the box has more than one GPU. The two shape A/Bs time the rule that picks
``small`` or ``small-m32`` (``kernel/NOTES.md`` v24-v27), so they run only where ``auto`` takes
those configs (the build step's probe says); ``tp`` only with two GPUs or more. A step that
cannot run here is ``skipped`` with its reason. A failing step does not stop the next ones: the
run goes on and exits 1 at the end.

Everything goes into one folder, ``reports/<UTC time>-bringup-<gpu>-<sha7>/`` (or ``--out``):
each step's log (``<step>.log``), ``mma-peak.json``, ``nvml-lag.json``, and ``bringup.json`` + ``README.md``
(each step: its command, status, exit code, seconds, the report folders it wrote, its log's last
line; a pytest step whose every test skipped is recorded ``skipped``, not ``passed``). Those two
are rewritten after every step, atomically, so a run cut short leaves the record of the steps
it finished. The other steps write their own report folders under ``reports/`` as usual.

    python -m harness bringup [--only a,b] [--skip a,b] [--out DIR] [--list] [--step-timeout S]

Running again into the same ``--out`` replaces the records of the steps it runs and keeps the
others (e.g. ``--only tp`` after a box with more GPUs was lent); a step this run skips keeps the
earlier run's outcome, and each step records the commit and box it ran on (the README marks a
step of another commit or box). ``--list`` prints the plan and each skip's reason without running
anything. ``--only``/``--skip`` that leave no step to run, or an ``--out`` that is empty, cannot
be written, holds other files (``--out .`` would write over the project's README), holds another
command's run (``results.json``: the mma-peak and nvml-lag steps write into this folder) or a ``bringup.json``
this version cannot read back, exit 2 before any step. A box where torch sees no GPU skips every
step and exits 3: nothing was brought up. SIGTERM and SIGHUP stop the running step as Ctrl-C
does, and the record names the signal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.box_record import BRINGUP_RECORD as RECORD_FILE
from harness.cli import REPO_ROOT as ROOT
from harness.cli import from_checkout, positive_number, shown, signals_as_interrupt
from harness.results import REPORTS_DIR, run_folder

SCHEMA = "verify-attention/bringup"
SCHEMA_VERSION = 1
PROBE_PREFIX = "bringup-probe: "
MMA_SYNC_CONFIGS = ("small", "small-m32")
STATUSES = ("passed", "failed", "timed-out", "interrupted", "skipped", "not-run")


@dataclass(frozen=True)
class Box:
    """What the plan depends on: how many GPUs, their name and compute capability."""

    gpus: int
    name: str | None = None
    capability: str | None = None


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    argv: tuple[str, ...]  # after ``python``; "{out}" stands for this run's folder
    timeout_s: int
    # None: runs; else the reason it is skipped. Takes the box and the build probe's answer
    # (None before the build step ran, or when it failed).
    skip: Callable[[Box, dict[str, Any] | None], str | None] = lambda box, probe: None
    # Where ``skip`` reads the probe: the condition in words, for ``--list`` (which has no probe).
    probe_condition: str = ""


def _xdist() -> tuple[str, ...]:
    return ("-n", "8") if importlib.util.find_spec("xdist") is not None else ()


def _pytest_gpu(*args: str) -> tuple[str, ...]:
    """``python -m pytest`` of the gpu-marked tests, quiet, skip reasons in the summary (-rs)."""
    return ("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs", *args)


def _needs_mma_sync_auto(box: Box, probe: dict[str, Any] | None) -> str | None:
    if probe is None:
        return "the build step's probe did not run or failed, so which configs auto takes here is unknown"
    taken = sorted(set(probe.get("auto", {}).values()))
    if not set(taken) & set(MMA_SYNC_CONFIGS):
        return f"auto takes {', '.join(taken) or 'nothing'} here, not small/small-m32: the shape rule does not apply"
    return None


def tp_size(gpus: int) -> int | None:
    """The TP degree this box can time: the largest of 8, 4, 2 that it has GPUs for."""
    return next((n for n in (8, 4, 2) if gpus >= n), None)


def _needs_two_gpus(box: Box, probe: dict[str, Any] | None) -> str | None:
    return None if tp_size(box.gpus) else f"tensor-parallel timing needs 2 GPUs or more; {box.gpus} visible"


def _needs_nvidia_smi(box: Box, probe: dict[str, Any] | None) -> str | None:
    return None if shutil.which("nvidia-smi") else "nvidia-smi is not on the PATH"


def _needs_pynvml(box: Box, probe: dict[str, Any] | None) -> str | None:
    return None if importlib.util.find_spec("pynvml") else "pynvml is not installed (NVML is read through it)"


def _no_gpu(box: Box) -> str | None:
    return None if box.gpus >= 1 else "no CUDA device is visible to torch"


def plan(box: Box) -> list[Step]:
    """Every step, in order, for ``box`` (skips are decided when a step's turn comes)."""
    spread = ("--gpus", "all") if box.gpus > 1 else ()
    n = tp_size(box.gpus) or 2
    return [
        Step(
            "box",
            "the GPUs, driver and links (nvidia-smi)",
            ("-m", "harness.bringup", "--box"),
            120,
            _needs_nvidia_smi,
        ),
        Step(
            "build",
            "the kernel extension and the configs auto takes here",
            ("-m", "harness.bringup", "--probe"),
            900,
        ),
        Step(
            "gpu-tests",
            "pytest -m gpu (all but the sanitizer tests)",
            _pytest_gpu(*_xdist(), "tests", "--ignore=tests/test_kernel_sanitizer.py"),
            1800,
        ),
        Step(
            "sanitizer",
            "compute-sanitizer memcheck and racecheck",
            _pytest_gpu("tests/test_kernel_sanitizer.py"),
            900,
        ),
        Step(
            "parity",
            "parity on the six bundles, with the mutation controls",
            ("-m", "harness", "parity", "--mutations"),
            1200,
        ),
        Step("sweep", "the default grid", ("-m", "harness", "sweep", "--grid", "default", *spread), 3600),
        Step(
            "sweep-sm120",
            "sm_120's configs forced, every target call",
            ("-m", "harness", "sweep", "--grid", "sm120", *spread),
            3600,
        ),
        Step(
            "mma-peak",
            "mma.sync's own rate beside the matmul",
            ("-m", "harness", "mma-peak", "--out", "{out}"),
            900,
        ),
        Step(
            "nvml-lag",
            "how late NVML reports a power cap (loads from idle)",
            ("-m", "harness", "nvml-lag", "--out", "{out}"),
            300,
            _needs_pynvml,
        ),
        Step(
            "ab-shape-32",
            "the shape rule against M=32 always, where the rule takes M=48",
            ("-m", "harness", "ab", "--base-define", "VA_SMALL_SHAPE=32", "--grid", "default"),
            3600,
            _needs_mma_sync_auto,
            "auto takes small/small-m32",
        ),
        Step(
            "ab-shape-48",
            "the shape rule against M=48 always, where the rule takes M=32",
            ("-m", "harness", "ab", "--base-define", "VA_SMALL_SHAPE=48", "--grid", "quick"),
            3600,
            _needs_mma_sync_auto,
            "auto takes small/small-m32",
        ),
        Step(
            "ab-combine",
            "v59's wide combine against the two-pass one",
            ("-m", "harness", "ab", "--base-define", "VA_COMBINE_TWO_PASS", "--grid", "quick"),
            3600,
        ),
        Step(
            "tp",
            f"the default grid tensor-parallel on {n} GPUs",
            ("-m", "harness", "sweep", "--grid", "default", "--tp", str(n)),
            3600,
            _needs_two_gpus,
        ),
    ]


STEP_NAMES = tuple(s.name for s in plan(Box(gpus=2)))


def select(steps: list[Step], only: Sequence[str] | None, skip: Sequence[str] | None) -> list[Step]:
    for option, names in (("--only", only), ("--skip", skip)):
        unknown = [n for n in names or () if n not in STEP_NAMES]
        if unknown:
            raise ValueError(
                f"{option}: unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEP_NAMES)}"
            )
    chosen = [s for s in steps if (only is None or s.name in only) and s.name not in (skip or ())]
    if not chosen:
        given = " ".join(
            f"{o} {','.join(n)!r}" for o, n in (("--only", only), ("--skip", skip)) if n is not None
        )
        raise ValueError(
            f"{given or 'the plan'} selects no step; expected at least one of {', '.join(s.name for s in steps)}"
        )
    return chosen


# ---------------------------------------------------------------------------------------------
# The record


@dataclass
class StepRecord:
    name: str
    what: str
    command: str
    status: str = "not-run"
    rc: int | None = None
    seconds: float | None = None
    log: str | None = None
    reports: list[str] = field(default_factory=list)
    reason: str = ""
    started_utc: str | None = None
    summary: str = ""  # the log's last line: pytest's counts, a sweep's rows and errors, ...
    # where this step's status was decided: a resumed run's earlier steps keep their own
    commit: str | None = None
    gpu: str | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def step_argv(step: Step, out_dir: Path) -> list[str]:
    """The step's arguments after ``python``, ``{out}`` as the run's folder (relative to the
    checkout when inside it: the children run from its root)."""
    return [a.replace("{out}", str(from_checkout(out_dir))) for a in step.argv]


def command_text(step: Step, out_dir: Path) -> str:
    return shlex.join(["python", *step_argv(step, out_dir)])


def load_record(out_dir: Path) -> dict[str, Any] | None:
    """The bring-up record a previous run left in ``out_dir`` (None when there is none), checked
    for every field this run reads back (the steps and commands it keeps, the probe); ValueError
    naming ``--out`` and the file otherwise."""
    path = out_dir / RECORD_FILE
    if not (path.exists() or path.is_symlink()):
        return None
    there = f"--out {out_dir}: {RECORD_FILE} there"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise ValueError(
            f"{there} is unreadable ({why}); expected a bring-up's record: give another folder"
        ) from e
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        schema = record.get("schema") if isinstance(record, dict) else f"none: a JSON {type(record).__name__}"
        raise ValueError(
            f"{there} is not a bringup record (schema {schema!r}); expected {SCHEMA!r}: give another folder"
        )
    version = record.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ValueError(
            f"{there} has schema_version {version!r}; this harness reads version {SCHEMA_VERSION} "
            "only: give another folder"
        )
    problem = _record_problem(record)
    if problem:
        raise ValueError(f"{there} is malformed: {problem}; give another folder")
    return record


def _record_problem(record: dict[str, Any]) -> str:
    """What in a bring-up record this run could not read back, naming the field; "" when none."""

    def text(value: Any) -> bool:
        return isinstance(value, str)

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if record.get("created_utc") is not None and not text(record["created_utc"]):
        return f"created_utc must be a string, got {record['created_utc']!r}"
    commands = record.get("commands", [])
    if not isinstance(commands, list):
        return f"commands must be a list, got {type(commands).__name__}"
    for i, c in enumerate(commands):
        if not (isinstance(c, dict) and text(c.get("command")) and text(c.get("started_utc"))):
            return f"commands[{i}] must be an object with the strings command and started_utc, got {c!r}"
    probe = record.get("probe")
    if probe is not None and not (
        isinstance(probe, dict)
        and isinstance(probe.get("auto", {}), dict)
        and all(text(k) and text(v) for k, v in probe.get("auto", {}).items())
    ):
        return f"probe must be null or an object whose auto maps calls to configs, got {probe!r}"
    steps = record.get("steps", [])
    if not isinstance(steps, list):
        return f"steps must be a list, got {type(steps).__name__}"
    for i, st in enumerate(steps):
        if not isinstance(st, dict):
            return f"steps[{i}] must be an object, got {st!r}"
        if not text(st.get("name")) or not st["name"]:
            return f"steps[{i}] has no name (a non-empty string)"
        where = f"steps[{i}] ({st['name']})"
        if st.get("status") not in STATUSES:
            return f"{where}: status must be one of {', '.join(STATUSES)}, got {st.get('status')!r}"
        for key, ok, expected in (
            ("rc", lambda v: type(v) is int, "an integer"),
            ("seconds", number, "a number"),
            ("command", text, "a string"),
            ("what", text, "a string"),
            ("reason", text, "a string"),
            ("summary", text, "a string"),
            ("log", text, "a string"),
            ("started_utc", text, "a string"),
        ):
            if st.get(key) is not None and not ok(st[key]):
                return f"{where}: {key} must be {expected} or null, got {st[key]!r}"
        reports = st.get("reports", [])
        if not (isinstance(reports, list) and all(text(r) for r in reports)):
            return f"{where}: reports must be a list of strings, got {reports!r}"
    return ""


def render_readme(record: dict[str, Any]) -> str:
    box = record.get("box") or {}
    git = record.get("git") or {}
    lines = [
        f"# Bring-up of {box.get('name') or 'a box without a GPU'} ({box.get('gpus', 0)} GPU(s), "
        f"compute capability {box.get('capability') or '-'}) at {(git.get('sha') or 'an unknown commit')[:7]}",
        "",
        "Written by `python -m harness bringup` (harness/bringup.py); each step's log is beside this file.",
        "",
    ]
    runs = record.get("commands") or [
        {"command": record.get("command", ""), "started_utc": record.get("updated_utc", "")}
    ]
    lines += [f"- `{r['command']}`, {r['started_utc']}" for r in runs] + [""]
    probe = record.get("probe")
    if probe:
        auto = ", ".join(f"{k}: {v}" for k, v in sorted((probe.get("auto") or {}).items()))
        lines += [f"`auto` here (the build step's probe): {auto}.", ""]
    lines += [
        "| step | status | exit | seconds | reports | command / reason | last line of its log |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in record.get("steps", []):
        secs = "" if s.get("seconds") is None else f"{s['seconds']:.0f}"
        rc = "" if s.get("rc") is None else str(s["rc"])
        reports = "<br>".join(f"`{r}`" for r in s.get("reports", [])) or ""
        detail = s.get("reason") if s.get("status") == "skipped" else f"`{s.get('command', '')}`"
        if s.get("status") == "passed" and s.get("reason"):
            detail += f" ({s['reason']})"
        here = (
            (git.get("sha") or "")[:7] + ("+dirty" if git.get("dirty") else ""),
            f"{box.get('gpus', 0)}x {box.get('name') or 'no GPU'}",
        )
        there = (s.get("commit"), s.get("gpu"))
        if None not in there and there != here:
            detail += f" [run at {there[0]} on {there[1]}]"
        last = (s.get("summary") or "").replace("|", "\\|")
        lines.append(f"| {s['name']} | **{s['status']}** | {rc} | {secs} | {reports} | {detail} | {last} |")
    totals = {st: sum(1 for s in record.get("steps", []) if s.get("status") == st) for st in STATUSES}
    lines += ["", ", ".join(f"{v} {k}" for k, v in totals.items() if v) + "."]
    return "\n".join(lines) + "\n"


def write_record(out_dir: Path, record: dict[str, Any]) -> None:
    from harness.results import atomic_write_text

    record["updated_utc"] = _now()
    atomic_write_text(out_dir / RECORD_FILE, json.dumps(record, indent=1) + "\n")
    atomic_write_text(out_dir / "README.md", render_readme(record))


def merge_steps(previous: list[dict[str, Any]], current: list[StepRecord]) -> list[dict[str, Any]]:
    """The steps in plan order: this run's where it has run one (or has one the previous record
    lacks), the previous record's otherwise. A resumed run that stops early so keeps what the
    earlier run recorded for the steps it did not reach, which still match their logs; and one
    that skips a step the earlier run passed or failed keeps that outcome (each step names the
    commit and box it ran on)."""
    theirs = {s["name"]: s for s in previous}

    def keep_theirs(s: StepRecord) -> bool:
        # not reached in this run, or skipped in it (e.g. the TP step on a box with fewer GPUs)
        # where the earlier run has an outcome, which still matches its log and reports
        earlier = theirs.get(s.name, {}).get("status")
        return earlier is not None and (
            s.status == "not-run" or (s.status == "skipped" and earlier not in ("skipped", "not-run"))
        )

    ours = {s.name: asdict(s) for s in current if not keep_theirs(s)}
    names = [*STEP_NAMES, *(n for n in [*theirs, *ours] if n not in STEP_NAMES)]
    return [ours.get(n) or theirs[n] for n in dict.fromkeys(names) if n in ours or n in theirs]


# ---------------------------------------------------------------------------------------------
# Running


def _report_dirs() -> set[str]:
    if not REPORTS_DIR.is_dir():
        return set()
    return {p.name for p in REPORTS_DIR.iterdir() if p.is_dir()}


# How long a stopped step has to clean up after Ctrl-C before it is killed: a sweep over several
# GPUs stops its workers (each in a session of its own, out of the step's process group's reach)
# and removes their files; a test run ends its test.
STOP_GRACE_S = 30.0


def stop_step(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int:
    """Stop a step's process group: Ctrl-C (SIGINT) first, so that the step cleans up as it does
    for a user's Ctrl-C, then SIGKILL after ``grace_s`` (or at once on a second Ctrl-C). A group
    started in a session of its own gets no terminal's Ctrl-C, so it is sent here. Returns its
    exit status."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # the user asked twice: no more grace
            continue
    return proc.wait()


def run_step(
    step: Step, out_dir: Path, python: str, timeout_s: float | None, env: dict[str, str]
) -> StepRecord:
    """Run one step as a child process in its own process group, its output into its log."""
    rec = StepRecord(step.name, step.what, command_text(step, out_dir), started_utc=_now())
    log = out_dir / f"{step.name}.log"
    rec.log = log.name
    argv = [python, *step_argv(step, out_dir)]
    before = _report_dirs()
    limit = timeout_s if timeout_s is not None else step.timeout_s
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        f.write(f"$ {rec.command}\n")
        f.flush()
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rec.rc = proc.wait(timeout=limit)
            rec.status = "passed" if rec.rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            rec.rc = stop_step(proc)
            rec.status = "timed-out"
            rec.reason = f"stopped after {limit:.0f} s (--step-timeout)"
        except BaseException:
            stop_step(proc)
            raise
    rec.seconds = round(time.monotonic() - start, 1)
    rec.reports = sorted(_report_dirs() - before - {out_dir.name})
    rec.summary = last_line(log)
    if rec.status == "passed" and _is_pytest(step) and _all_skipped(rec.summary):
        # a run whose every test skipped (no GPU, no compute-sanitizer, ...) proves nothing
        rec.status, rec.reason = (
            "skipped",
            f"every test skipped ({rec.summary}); the log's short summary says why",
        )
    elif rec.status == "passed" and _is_pytest(step) and (skipped := _counts(rec.summary).get("skipped")):
        # passed, but not all of it ran: said beside the status, not only in the log's last line
        rec.reason = f"{skipped} test(s) skipped; the log's short summary says why"
    return rec


def last_line(log: Path) -> str:
    """The log's last non-empty line (a progress bar's carriage returns end lines too)."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    return next((line.strip()[:300] for line in reversed(text.splitlines()) if line.strip()), "")


def _is_pytest(step: Step) -> bool:
    return step.argv[:2] == ("-m", "pytest")


def _counts(summary: str) -> dict[str, int]:
    """pytest's summary line as counts: {"passed": 185, "skipped": 2, ...}."""
    return {name: int(n) for n, name in re.findall(r"(\d+) (passed|failed|skipped|error|errors)\b", summary)}


def _all_skipped(summary: str) -> bool:
    """pytest's summary counts skipped tests and none that passed or failed."""
    counts = _counts(summary)
    return counts.get("skipped", 0) > 0 and not any(
        counts.get(k) for k in ("passed", "failed", "error", "errors")
    )


def read_probe(log: Path) -> dict[str, Any] | None:
    """The build step's answer: its log's last ``bringup-probe:`` line."""
    if not log.is_file():
        return None
    found = None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(PROBE_PREFIX):
            with contextlib.suppress(json.JSONDecodeError):
                found = json.loads(line[len(PROBE_PREFIX) :])
    return found


# Calls the probe asks ``planned_config`` about: (label, tokens, heads, KV indices), B=1.
PROBE_CALLS = (
    ("P=4k H=8 T=16", 16, 8, 4096),
    ("P=32k H=8 T=16", 16, 8, 32768),
    ("P=200k H=8 T=16", 16, 8, 200000),
    ("P=64k H=64 T=16", 16, 64, 65536),
    ("P=4k H=128 T=256", 256, 128, 4096),
)


def probe() -> int:
    """The build step: build (or load) the extension, then print which config ``auto`` takes
    for a few target calls here (shapes only: nothing is launched)."""
    import torch

    import kernel
    from kernel.build import load_extension, loaded_build

    if not torch.cuda.is_available():
        print("error: bringup --probe: no CUDA device is visible to torch", file=sys.stderr)
        return 2
    load_extension(verbose=False)
    print("built", loaded_build(), flush=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    auto = {}
    for label, tokens, heads, keys in PROBE_CALLS:
        q = torch.empty(tokens, heads, 576, dtype=torch.bfloat16, device=dev)
        kv_indices = torch.empty(keys, dtype=torch.int32, device=dev)
        qo_indptr = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
        auto[label] = kernel.planned_config(q, kv_indices, qo_indptr)
    props = torch.cuda.get_device_properties(dev)
    print(
        PROBE_PREFIX + json.dumps({"device": props.name, "cc": f"{props.major}.{props.minor}", "auto": auto}),
        flush=True,
    )
    return 0


def detect_box() -> Box:
    import torch

    if not torch.cuda.is_available():
        return Box(gpus=0)
    props = torch.cuda.get_device_properties(0)
    return Box(gpus=torch.cuda.device_count(), name=props.name, capability=f"{props.major}.{props.minor}")


def invocation(args: argparse.Namespace) -> str:
    """The command line of this run, from its options."""
    argv = ["python", "-m", "harness", "bringup"]
    for option, value in (("--only", args.only), ("--skip", args.skip), ("--out", args.out)):
        if value:
            argv += [option, str(from_checkout(Path(value))) if option == "--out" else value]
    if args.step_timeout:
        argv += ["--step-timeout", f"{args.step_timeout:g}"]
    return shlex.join(argv)


def _names(text: str | None) -> list[str] | None:
    """The step names of ``--only``/``--skip``; None without the option (an empty value is an
    empty list: ``--only ''`` selects no step, and is refused, rather than every step)."""
    return [x.strip() for x in text.split(",") if x.strip()] if text is not None else None


def main(
    args: argparse.Namespace,
    box: Box | None = None,
    python: str | None = None,
    steps: list[Step] | None = None,
) -> int:
    """Run the plan (``box``, ``python`` and ``steps`` stand in for the real ones in tests)."""
    from harness.env import git_info

    box = box or detect_box()
    try:
        steps = select(steps if steps is not None else plan(box), _names(args.only), _names(args.skip))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out is not None and not args.out:
        print("error: --out is empty; expected the run's folder (or no --out for a new one)", file=sys.stderr)
        return 2
    git = git_info()
    out_dir = (
        Path(args.out)
        if args.out
        else run_folder("bringup", box.name, git.get("sha"), datetime.now(timezone.utc))
    )
    if args.list:
        for s in steps:
            if s.probe_condition:
                note = f"  [only where {s.probe_condition}: the build step's probe decides]"
            else:
                reason = _no_gpu(box) or s.skip(box, None)
                note = f"  [skipped: {reason}]" if reason else ""
            print(f"{s.name:12s} {command_text(s, out_dir)}{note}")
        return 0
    from harness.cli import check_out_dir, held_results

    try:
        held = held_results(out_dir) if out_dir.is_dir() else None
        if held is not None:  # a sweep's or parity's folder; mma-peak and nvml-lag write into this one
            raise ValueError(
                f"--out {out_dir} holds a run's {held.name}: another command's report folder, not a "
                "bring-up's; give a new folder, or a bring-up's to resume it"
            )
        if out_dir.is_dir() and not (out_dir / RECORD_FILE).exists() and any(out_dir.iterdir()):
            # the record and README.md would be written over whatever is there (`--out .`: the
            # project's own README)
            raise ValueError(
                f"--out {out_dir} is a folder of other files; expected a new or empty folder, or a "
                "bring-up's (holding bringup.json) to resume it"
            )
        previous = load_record(out_dir) or {}
        check_out_dir(out_dir)
    except OSError as e:
        print(
            f"error: --out {args.out}: {e.strerror or e}; expected a folder that can be made", file=sys.stderr
        )
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    commit = (git.get("sha") or "unknown")[:7] + ("+dirty" if git.get("dirty") else "")
    gpu = f"{box.gpus}x {box.name or 'no GPU'}"
    this_run = {"command": invocation(args), "started_utc": _now(), "commit": commit, "gpu": gpu}
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created_utc": previous.get("created_utc") or _now(),
        "command": invocation(args),
        "commands": [*previous.get("commands", []), this_run],
        "git": git,
        "box": asdict(box),
        "probe": previous.get("probe"),
    }
    records = [StepRecord(s.name, s.what, command_text(s, out_dir)) for s in steps]
    old_steps = previous.get("steps", [])
    record["steps"] = merge_steps(old_steps, records)
    write_record(out_dir, record)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    python = python or sys.executable
    failed = False
    with signals_as_interrupt() as received:
        for i, step in enumerate(steps):
            failed |= _run_one(
                i, step, records, record, old_steps, out_dir, python, args, env, box, (commit, gpu), received
            )
    if all(r.status in ("skipped", "not-run") for r in records) and _no_gpu(box):
        print(
            f"bringup: nothing brought up: {_no_gpu(box)} (a CPU build of torch, or CUDA_VISIBLE_DEVICES "
            f"empty?) -> {shown(out_dir)}/README.md",
            file=sys.stderr,
        )
        return 3
    skipped = [r.name for r in records if r.status == "skipped"]
    partly = [r.name for r in records if r.status == "passed" and r.reason]
    verdict = "some steps failed" if failed else "no step failed"
    if skipped:
        verdict += f" ({len(skipped)} skipped: {', '.join(skipped)})"
    if partly:
        verdict += f" (tests skipped within: {', '.join(partly)})"
    print(f"bringup: {verdict} -> {shown(out_dir)}/README.md")
    return 1 if failed else 0


def _run_one(
    i: int,
    step: Step,
    records: list[StepRecord],
    record: dict[str, Any],
    old_steps: list[dict[str, Any]],
    out_dir: Path,
    python: str,
    args: argparse.Namespace,
    env: dict[str, str],
    box: Box,
    stamp: tuple[str, str],
    received: list[str],
) -> bool:
    """Run or skip step ``i`` and record it (``stamp``: this run's commit and box); True when
    it failed."""
    failed = False
    reason = _no_gpu(box) or step.skip(box, record.get("probe"))
    if reason:
        records[i].status, records[i].reason = "skipped", reason
        print(f"bringup: {step.name}: skipped ({reason})", flush=True)
    else:
        print(f"bringup: {step.name}: {records[i].command}", flush=True)
        try:
            records[i] = run_step(step, out_dir, python, args.step_timeout, env)
        except KeyboardInterrupt:  # the child is killed; the record says where the run stopped
            why = f"a {received[-1]}" if received else "the user (Ctrl-C)"
            records[i].status, records[i].reason = "interrupted", f"stopped by {why}"
            records[i].commit, records[i].gpu = stamp
            record["steps"] = merge_steps(old_steps, records)
            write_record(out_dir, record)
            raise
        if step.name == "build":
            record["probe"] = read_probe(out_dir / records[i].log) if records[i].status == "passed" else None
        failed = records[i].status in ("failed", "timed-out")
        print(
            f"bringup: {step.name}: {records[i].status} (exit {records[i].rc}, {records[i].seconds:.0f} s)",
            flush=True,
        )
    records[i].commit, records[i].gpu = stamp
    record["steps"] = merge_steps(old_steps, records)
    write_record(out_dir, record)
    return failed


def register_cli(sub: Any) -> None:
    p = sub.add_parser(
        "bringup",
        help="the first run on a new box: GPU tests, parity, sweeps, mma.sync's ceiling, A/Bs, TP, one folder",
        description=__doc__.split("\n\n", 1)[0],
    )
    p.add_argument(
        "--only", metavar="STEPS", help=f"run only these steps (comma-separated): {', '.join(STEP_NAMES)}"
    )
    p.add_argument("--skip", metavar="STEPS", help="run every step but these (comma-separated)")
    p.add_argument(
        "--out", metavar="DIR", help="the run's folder (default: reports/<time>-bringup-<gpu>-<sha7>)"
    )
    p.add_argument("--list", action="store_true", help="print the steps and their commands; run nothing")
    p.add_argument(
        "--step-timeout",
        type=positive_number("seconds"),
        metavar="S",
        help="stop a step still running after S seconds: Ctrl-C, then SIGKILL after 30 s (default: per step)",
    )
    p.set_defaults(func=main)


# What the box step records: the GPUs, the driver and clocks, and how the GPUs are linked.
NVIDIA_SMI_QUERIES = (("-L",), (), ("topo", "-m"))


def describe_box() -> int:
    """The box step: each ``nvidia-smi`` query's output under a header; exits 1 if one fails."""
    failed = 0
    for args in NVIDIA_SMI_QUERIES:
        cmd = ["nvidia-smi", *args]
        print(f"$ {shlex.join(cmd)}", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        print(done.stdout.rstrip() + (f"\n{done.stderr.rstrip()}" if done.stderr.strip() else ""), flush=True)
        if done.returncode != 0:
            print(f"(exit {done.returncode})", flush=True)
            failed = 1
    print(
        f"box: {len(NVIDIA_SMI_QUERIES)} nvidia-smi queries, {'one or more failed' if failed else 'all answered'}"
    )
    return failed


if __name__ == "__main__":  # the box and build steps: python -m harness.bringup --box | --probe
    entries = {"--box": describe_box, "--probe": probe}
    if len(sys.argv) != 2 or sys.argv[1] not in entries:
        sys.exit(
            "usage: python -m harness.bringup --box | --probe (the bring-up's first two steps; "
            "the bring-up is python -m harness bringup)"
        )
    sys.exit(entries[sys.argv[1]]())
