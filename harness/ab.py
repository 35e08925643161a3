"""Same-GPU A/B: the kernel of another git revision against this checkout's, in one process.

    python -m harness ab --base REV [--grid quick] [--impl verify-attn-cuda] [--rounds 6] [--out DIR]
    python -m harness ab --base-define VA_X [--base-define VA_Y=2] [--grid quick]   # two builds
    python -m harness ab --slowdown 1.10 [--grid quick]      # self-check: HEAD against HEAD + 10 %

Two reports from two runs differ by more than the code: the board, its clocks, the driver, the
temperature. An A/B run removes those: both kernels are timed on the same GPU, in the same
process, on the same inputs, interleaved.

Method
------
* BASE: ``git worktree add --detach`` checks REV out into a temporary folder beside this
  checkout; its ``kernel`` package is imported under another module name
  (``importlib.util.spec_from_file_location`` with ``submodule_search_locations``, so its
  relative imports resolve inside the worktree, not in this checkout). The kernel's JIT build is
  named by a hash of its sources, so the two builds never collide. The worktree is removed at
  the end, whatever happens.
* HEAD: this checkout's ``kernel`` package, uncommitted changes included (the label says
  ``+dirty`` then).
* ``--base-define NAME[=VALUE]`` (repeatable) instead of ``--base``: BASE is this checkout's
  ``kernel`` package again, imported under another name with ``kernel.build.EXTRA_CUDA_FLAGS`` set
  to ``-DNAME[=VALUE]`` for each, so its build differs from HEAD's only by those macros (the
  build's hash covers them). This times a build switch (the ``VA_*`` macros of ``kernel/csrc``)
  against the default build, as the variant A/Bs of ``kernel/NOTES.md`` do; outputs that differ
  in any bit are noted with the largest difference.
* Each revision is called through its own API (``pack_parents`` for its tree-mask format,
  ``verify_attention`` with the eight documented arguments); where a revision's
  ``verify_attention`` accepts preallocated ``out``/``lse`` or ``validate``, the first call
  validates and the timed calls reuse the outputs and skip the host-side checks, as the
  registry entry does.
* Cases: the grid's cases (``harness/grids``) that time ``--impl``, with their modes and timing
  policy. Before timing, each side runs once; a side that raises or returns NaN or Inf is not
  timed and its row says why (the other side is, so a HEAD that breaks reads as a regression),
  and the largest difference between the two outputs is noted (revisions may round differently).
  The kernel package must keep its internal imports relative for the BASE import to hold.
* Interleaving: ``--rounds`` rounds per case and mode, BASE then HEAD in even rounds, HEAD then
  BASE in odd ones (ABBA), so slow drift (clocks, temperature) loads both sides alike. Each
  round is one :func:`harness.timing.measure` block (warm-up, cold L2, CUDA events) per side;
  a side's samples are the union of its blocks.
* Verdicts: :func:`harness.compare.timing_decision` on the two sample sets (the rule is in
  :mod:`harness.compare`).
* ``--slowdown F`` times this checkout against itself with a spin kernel
  (``torch.cuda._sleep``) appended to every HEAD call, sized to ``F - 1`` of the case's median,
  so one can watch the gate catch a known regression. The self-check passes (exit 0) when some
  case is SLOWER and none is SAME or FASTER; NOISY cases are ones the gate cannot vouch for at
  that effect.

Output: ``results.json`` of kind "ab" (rows ``base:<sha7>`` and ``head:<sha7>``; each HEAD row's
note holds its verdict; ``speedup`` as in a sweep, over the other side; the run's notes list every
verdict), ``index.html`` and the compare HTML, under ``reports/<UTC time>-ab-<grid>-<gpu>-
<base sha7>-vs-<head sha7>/`` unless ``--out``. Exit 1 on any SLOWER (or a failed self-check),
2 when it cannot run (no CUDA, unknown revision, an ``--out`` that cannot be written or holds a
run: checked before the timing and again before writing) or when a case has no samples on a side
(a BASE that did not build: the run is written, its rows say why), else 0. ``results.json`` is
written last, after the pages. ``--base REV`` is resolved in the repository of the harness that
runs (this checkout), wherever the command runs from.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from harness import compare
from harness.batch import VerifyBatch
from harness.cases import build_batch
from harness.cli import REPO_ROOT, check_run_out_dir, held_results, nonempty_path
from harness.env import environment, git_info
from harness.impl_kernel import kernel_call
from harness.registry import RunFn, impl_config_of
from harness.results import REPORTS_DIR, Results, SweepRow, atomic_write_text, keep_and_raise, write_results
from harness.sweep import GridError, PlannedCase, TimingPolicy, load_grid, with_speedups
from harness.timing import (
    GpuLockError,
    exclusive_gpu,
    l2_bytes_of,
    measure,
    rotation_sets,
    round_sig,
    summarize,
)

DEFAULT_ROUNDS = 6
MIN_SAMPLES_PER_ROUND = 5
# The only registry entry built from this repository's kernel package, hence per revision.
KERNEL_IMPL = "verify-attn-cuda"
BASE_PREFIX, HEAD_PREFIX = "base:", "head:"
SLEEP_CALIBRATION_CYCLES = 1_000_000


class ABError(RuntimeError):
    """An A/B run that cannot start: no CUDA, unknown revision, a revision without the kernel."""


# ---------------------------------------------------------------------------------------------
# The base revision: a worktree and its kernel package under another name


def worktree_add_command(repo: Path, path: Path, sha: str) -> list[str]:
    return ["git", "-C", str(repo), "worktree", "add", "--detach", str(path), sha]


def worktree_remove_command(repo: Path, path: Path) -> list[str]:
    return ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)]


@contextmanager
def revision_worktree(repo: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of ``sha`` in a temporary folder beside ``repo``; removed on exit."""
    repo = Path(repo).resolve()
    try:
        path = Path(tempfile.mkdtemp(prefix=f"{repo.name}-ab-{sha[:7]}-", dir=repo.parent))
    except OSError as e:
        raise ABError(f"cannot create the worktree folder beside the checkout, in {repo.parent}: {e}") from e
    added = subprocess.run(worktree_add_command(repo, path, sha), capture_output=True, text=True, check=False)
    if added.returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        raise ABError(f"git worktree add of {sha[:7]} at {path} failed: {added.stderr.strip()}")
    try:
        yield path
    finally:
        removed = subprocess.run(
            worktree_remove_command(repo, path), capture_output=True, text=True, check=False
        )
        if removed.returncode != 0:
            # Keep git's worktree list clean even if the folder was already gone or is busy.
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True, check=False)


def import_package_as(name: str, package_dir: Path) -> ModuleType:
    """Import the package in ``package_dir`` as module ``name``; its relative imports resolve
    inside ``package_dir`` and a package of the same directory name elsewhere is untouched."""
    package_dir = Path(package_dir)
    init = package_dir / "__init__.py"
    if not init.is_file():
        raise ABError(f"{package_dir} has no __init__.py; expected a Python package there")
    if name in sys.modules:
        raise ABError(f"module name {name!r} is already imported; expected a fresh name")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(package_dir)])
    if spec is None or spec.loader is None:
        raise ABError(f"cannot import {init} as {name!r}")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: its relative imports look the parent up in sys.modules.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        raise
    return module


def flags_package(head_package: ModuleType, flags: Sequence[str]) -> ModuleType:
    """This checkout's kernel package again, under a name of its own, built with ``flags`` added
    to its nvcc options (``kernel.build.EXTRA_CUDA_FLAGS``); the same flags give the same module."""
    digest = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:10]
    name = f"kernel_flags_{digest}"
    module = sys.modules.get(name) or import_package_as(name, Path(head_package.__file__).parent)
    module.build.EXTRA_CUDA_FLAGS = tuple(flags)
    return module


_MACRO = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=\S*)?")


def parse_define(text: str) -> str:
    """``--base-define``: a preprocessor macro, ``NAME`` or ``NAME=VALUE`` (no spaces)."""
    if not _MACRO.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"--base-define must be a macro NAME or NAME=VALUE such as VA_SOME_SWITCH, got {text!r}"
        )
    return text


# ---------------------------------------------------------------------------------------------
# Calls and interleaved timing


def delayed(run_fn: RunFn, sleep_cycles: int) -> RunFn:
    """``run_fn`` followed by a spin kernel of ``sleep_cycles`` GPU clock cycles."""

    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        result = run_fn()
        torch.cuda._sleep(sleep_cycles)
        return result

    return run


def interleaved_samples(
    labels: Sequence[str], take: Callable[[str], list[float]], rounds: int
) -> dict[str, list[float]]:
    """``take(label)`` once per label per round, in order in even rounds and reversed in odd
    ones (ABBA...); returns every label's samples, concatenated over the rounds."""
    if rounds < 2:
        raise ValueError(f"rounds must be >= 2 so that each side goes first once, got {rounds}")
    samples: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels if r % 2 == 0 else list(reversed(labels)):
            samples[label] += take(label)
    return samples


def samples_per_round(min_samples: int, rounds: int) -> int:
    """Samples per block so that each side gets twice the grid's ``min_samples`` in total (the
    rank test and quartiles want more than one sweep row's worth), never fewer than 5."""
    return max(MIN_SAMPLES_PER_ROUND, math.ceil(2 * min_samples / rounds))


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class SideRows:
    """The samples of one case, mode and side, or why there are none."""

    case_id: str
    params: dict[str, Any]
    mode: str
    impl: str  # "base:<sha7>" or "head:<sha7>..."
    samples_ms: list[float]
    bytes: int
    flops: int
    note: str = ""
    impl_config: str = ""  # what the side's kernel ran (kernel.planned_config), where it says


def _row(s: SideRows) -> SweepRow:
    if not s.samples_ms:
        return SweepRow(
            case_id=s.case_id,
            impl=s.impl,
            params=s.params,
            mode=s.mode,
            samples_ms=[],
            median_ms=0.0,
            iqr_ms=0.0,
            min_ms=0.0,
            max_ms=0.0,
            bytes=s.bytes,
            flops=s.flops,
            status="error",
            note=s.note,
            impl_config=s.impl_config,
        )
    st = summarize(s.samples_ms)
    return SweepRow(
        case_id=s.case_id,
        impl=s.impl,
        params=s.params,
        mode=s.mode,
        samples_ms=[round_sig(x) for x in s.samples_ms],
        median_ms=round_sig(st.median_ms),
        iqr_ms=round_sig(st.iqr_ms),
        min_ms=round_sig(st.min_ms),
        max_ms=round_sig(st.max_ms),
        bytes=s.bytes,
        flops=s.flops,
        note=s.note,
        impl_config=s.impl_config,
    )


def ab_rows(
    pairs: Sequence[tuple[SideRows, SideRows]], *, min_change: float
) -> tuple[list[SweepRow], list[str]]:
    """Rows for (base, head) sample pairs: the HEAD row carries its verdict; plus the run notes."""
    rows, notes = [], []
    for base, head in pairs:
        b, h = _row(base), _row(head)
        d = compare.timing_decision(b.samples_ms, h.samples_ms, min_change=min_change)
        verdict = f"{d.verdict} vs {base.impl}: {d.reason}"
        h = replace(h, note="; ".join(x for x in (head.note, verdict) if x))
        rows += [b, h]
        notes.append(f"{d.verdict} {head.case_id} {head.mode}: {d.reason}")
    return with_speedups(rows), notes


def split_ab(results: Results) -> tuple[compare.Side, compare.Side]:
    """An "ab" run as two sides for :func:`harness.compare.compare_results`: rows named
    ``base:*`` and ``head:*``, each under the implementation it times (``params["impl"]``)."""

    def side(prefix: str) -> compare.Side:
        rows = [
            replace(r, impl=str(r.params.get("impl", r.impl)))
            for r in results.sweep
            if r.impl.startswith(prefix)
        ]
        labels = sorted({r.impl for r in results.sweep if r.impl.startswith(prefix)})
        git = results.git
        if prefix == BASE_PREFIX and labels:
            # "base:1a2b3c4" (a revision) or "base:1a2b3c4+dirty" (this checkout, in a self-check)
            revision = labels[0].removeprefix(BASE_PREFIX)
            git = {"sha": revision.split("+")[0], "dirty": "+dirty" in revision}
        return compare.Side(", ".join(labels) or prefix, replace(results, sweep=rows, git=git))

    return side(BASE_PREFIX), side(HEAD_PREFIX)


def slowdown_selfcheck(verdicts: Sequence[str]) -> tuple[bool, str]:
    """Whether the gate caught an injected slowdown: some SLOWER, no SAME or FASTER."""
    missed = [v for v in verdicts if v in (compare.SAME, compare.FASTER)]
    caught = verdicts.count(compare.SLOWER)
    noisy = verdicts.count(compare.NOISY)
    ok = caught > 0 and not missed
    text = f"self-check: the gate caught {caught} of {len(verdicts)} slowed cases, {noisy} noisy, {len(missed)} missed"
    return ok, text + ("" if ok else " -> FAILED")


def run_dir_name(grid: str, gpu_name: str | None, base7: str, head7: str, now: datetime) -> str:
    slug = compare.slug(gpu_name or "cpu")
    return (
        f"{now:%Y%m%dT%H%M%S}-ab-{compare.slug(grid)}-{slug}-{compare.slug(base7)}-vs-{compare.slug(head7)}"
    )


def default_out_dir(grid: str, gpu_name: str | None, base7: str, head7: str, now: datetime) -> Path:
    """reports/<UTC time>-ab-<grid>-<gpu>-<base sha7>-vs-<head sha7> in the repository's reports/
    (:data:`harness.results.REPORTS_DIR`), wherever the command runs from."""
    return REPORTS_DIR / run_dir_name(grid, gpu_name, base7, head7, now)


def write_report(results: Results, out_dir: Path, min_change: float) -> compare.Comparison:
    """Write the run's pages (index.html, the compare HTML), then ``results.json`` last, so that a
    run cut short never leaves a complete-looking results.json without its pages; prints the
    comparison and returns it."""
    from harness.report import render_html

    json_path = out_dir / "results.json"
    held = held_results(out_dir) if out_dir.is_dir() else None
    if (
        held is not None
    ):  # checked before the run too; another A/B queued on the GPU lock may have written since
        keep_and_raise(
            results, FileExistsError(str(held)), f"{out_dir}: already holds a run ({held.name})", ABError
        )
    try:
        atomic_write_text(out_dir / "index.html", render_html(results, str(json_path)), exclusive=True)
    except FileExistsError as e:
        keep_and_raise(results, e, f"{out_dir}: already holds an index.html, left as it was", ABError)
    except Exception as e:  # the overview page is extra: the comparison and the results still get written
        print(f"ab: index.html not rendered: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        comparison = compare.compare_results(*split_ab(results), min_change=min_change)
        print(compare.format_terminal(comparison))
        print(f"html: {compare.write_html(comparison, out_dir)}")
        write_results(results, json_path, exclusive=True)
    except BaseException as e:  # a full disk, a comparison that fails, Ctrl-C: the timings are kept
        what = "cannot write the run there" if isinstance(e, OSError) else "the run was not written"
        keep_and_raise(results, e, f"{out_dir}: {what}", ABError)
    return comparison


# ---------------------------------------------------------------------------------------------
# The run (CUDA only)


@dataclass(frozen=True)
class Contender:
    label: str
    make_call: Callable[[VerifyBatch], RunFn]


def _sleep_cycles_per_ms(device: torch.device) -> float:
    t = measure(
        lambda: torch.cuda._sleep(SLEEP_CALIBRATION_CYCLES), mode="cold", min_samples=10, device=device
    )
    return SLEEP_CALIBRATION_CYCLES / t.median_ms


def non_finite_reason(result: tuple[torch.Tensor, torch.Tensor | None]) -> str:
    bad = [
        n
        for n, t in zip(("out", "lse"), result, strict=True)
        if t is not None and not bool(torch.isfinite(t).all())
    ]
    return f"{' and '.join(bad)} contain NaN or Inf; not timed" if bad else ""


def _block_timer(
    calls: dict[str, list[RunFn]],
    mode: str,
    timing: TimingPolicy,
    per_round: int,
    rounds: int,
    device: torch.device,
    failed: dict[str, str],
) -> Callable[[str], list[float]]:
    """One measure() block of a side: its first input set, rotating through the others. A side
    whose block raises (say, a capture its revision does not support) is recorded in ``failed``
    and not timed again in this mode."""

    def take(label: str) -> list[float]:
        if label in failed:
            return []
        fns = calls[label]
        try:
            return measure(
                fns[0],
                mode=mode,
                rotate=fns[1:] or None,
                warmup=timing.warmup,
                min_samples=per_round,
                max_samples=per_round,
                max_time_s=timing.max_time_s / rounds,
                device=device,
            ).samples_ms
        except Exception as e:  # one side failing one mode is a row, not a crash of the run
            failed[label] = f"{mode} timing failed: {type(e).__name__}: {e}"
            return []

    return take


def time_case(
    case: PlannedCase,
    contenders: tuple[Contender, Contender],
    *,
    impl: str,
    rounds: int,
    device: torch.device,
    notes: list[str],
) -> list[tuple[SideRows, SideRows]]:
    """(BASE, HEAD) samples of one planned case in each of its modes. A side that fails or
    returns NaN is not timed and its rows say why; the other side is still timed, so that a HEAD
    which breaks reads as a regression (BASE has samples, HEAD none). Input sets rotate for a
    cold L2 on a GPU as in a sweep; ``notes`` gets what the outputs' comparison shows."""

    params, run = case.params, case.runs[0]
    batches = [build_batch(params, device)]
    sets = rotation_sets(batches[0].min_bytes(), l2_bytes_of(device)) if device.type == "cuda" else 0
    batches += [build_batch(params, device, input_set=k) for k in range(1, sets)]
    meta = {**params.to_json(), "impl": impl}
    calls: dict[str, list[RunFn]] = {}
    why: dict[str, str] = {}
    outputs = []
    for c in contenders:
        try:
            calls[c.label] = [c.make_call(b) for b in batches]
            result = calls[c.label][0]()
            why[c.label] = non_finite_reason(result)
            outputs.append(result[0])
        except Exception as e:  # a revision that cannot run a case is a row, not a crash
            why[c.label] = f"{type(e).__name__}: {e}"
    if len(outputs) == 2 and outputs[0].shape != outputs[1].shape:
        notes.append(
            f"{params.case_id}: BASE out {tuple(outputs[0].shape)}, HEAD out {tuple(outputs[1].shape)}"
        )
    elif len(outputs) == 2:
        diff = float((outputs[0].float() - outputs[1].float()).abs().max())
        if diff > 0:
            notes.append(f"{params.case_id}: BASE and HEAD outputs differ by up to {diff:.3g}")
    healthy = [c.label for c in contenders if not why[c.label]]
    per_round = samples_per_round(run.timing.min_samples, rounds)
    out = []
    for mode in run.modes:
        failed: dict[str, str] = {}
        take = _block_timer(calls, mode, run.timing, per_round, rounds, device, failed)
        got = interleaved_samples(healthy, take, rounds) if healthy else {}
        rows = [
            SideRows(
                params.case_id,
                meta,
                mode,
                c.label,
                [] if c.label in failed else got.get(c.label, []),
                batches[0].min_bytes(),
                batches[0].flops(),
                why[c.label] or failed.get(c.label, ""),
                impl_config_of(calls[c.label][0]) if calls.get(c.label) else "",
            )
            for c in contenders
        ]
        out.append((rows[0], rows[1]))
    return out


def _contenders(
    args: argparse.Namespace,
    head_module: ModuleType,
    head7: str,
    base: tuple[str, ModuleType] | None,
    device: torch.device,
) -> tuple[Contender, Contender]:
    if base is not None:
        base7, base_module = base
        return (
            Contender(f"{BASE_PREFIX}{base7}", lambda b: kernel_call(base_module, b)),
            Contender(f"{HEAD_PREFIX}{head7}", lambda b: kernel_call(head_module, b)),
        )
    cycles_per_ms = _sleep_cycles_per_ms(device)

    def slowed(batch: VerifyBatch) -> RunFn:
        fn = kernel_call(head_module, batch)
        median_ms = measure(fn, mode="cold", min_samples=10, max_samples=10, device=device).median_ms
        return delayed(fn, max(1, round((args.slowdown - 1.0) * median_ms * cycles_per_ms)))

    return (
        Contender(f"{BASE_PREFIX}{head7}", lambda b: kernel_call(head_module, b)),
        Contender(f"{HEAD_PREFIX}{head7}+slowdown{args.slowdown:g}", slowed),
    )


def _command(args: argparse.Namespace) -> str:
    words = ["python", "-m", "harness", "ab"]
    if args.slowdown:
        words += ["--slowdown", f"{args.slowdown:g}"]
    elif args.base_define:
        for d in args.base_define:
            words += ["--base-define", d]
    else:
        words += ["--base", args.base]
    words += ["--grid", args.grid, "--impl", args.impl, "--rounds", str(args.rounds)]
    if args.min_change != compare.DEFAULT_MIN_CHANGE:
        words += ["--min-change", f"{args.min_change:g}"]
    return shlex.join(words)


def run_ab(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise ABError(
            "ab times two kernels on one GPU and needs CUDA: torch.cuda.is_available() is False on this machine"
        )
    device = torch.device("cuda")
    git = git_info()
    head7 = f"{(git.get('sha') or 'nogit')[:7]}{'+dirty' if git.get('dirty') else ''}"
    grid = load_grid(args.grid)
    plan = grid.plan([args.impl])
    if not plan:
        raise ABError(f"--grid {args.grid}: no case times {args.impl}")
    try:
        check_run_out_dir(args.out, REPORTS_DIR)
    except ValueError as e:  # before the timing, so that a bad --out costs no run
        raise ABError(str(e)) from e
    # This checkout's kernel, imported only here so that other commands never depend on it.
    import kernel as head_module

    notes = [f"grid {grid.name}: {len(plan)} cases, {args.rounds} interleaved rounds per case and mode"]
    with ExitStack() as stack:
        base = None
        if args.base is not None:
            # the repository of the harness that runs (HEAD is its checkout), wherever the command runs from
            repo = compare.repo_root(REPO_ROOT)
            sha = compare.resolve_revision(repo, args.base)
            if sha is None:
                raise ABError(f"--base {args.base!r} is not a commit of the repository at {repo}")
            tree = stack.enter_context(revision_worktree(repo, sha))
            try:
                base = (sha[:7], import_package_as(f"kernel_base_{sha[:7]}", tree / "kernel"))
            except Exception as e:  # an old or broken revision: say which and why, no traceback
                raise ABError(f"the kernel package of {args.base} ({sha[:7]}) does not import: {e}") from e
            notes.append(f"BASE is {args.base} = {sha}")
        elif args.base_define:
            flags = tuple(f"-D{d}" for d in args.base_define)
            base = (f"{head7}+{'+'.join(args.base_define)}", flags_package(head_module, flags))
            notes.append(f"BASE is this checkout built with {' '.join(flags)}")
        else:
            notes.append(
                f"self-check: HEAD against HEAD with a spin of {args.slowdown - 1:.0%} of each case's median"
            )
        with exclusive_gpu():
            contenders = _contenders(args, head_module, head7, base, device)
            pairs = []
            for case in plan:
                pairs += time_case(
                    case, contenders, impl=args.impl, rounds=args.rounds, device=device, notes=notes
                )
                torch.cuda.empty_cache()
    rows, verdict_notes = ab_rows(pairs, min_change=args.min_change)
    results = Results(
        kind="ab",
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=_command(args),
        git=git,
        environment=environment(device),
        sweep=rows,
        notes=notes + verdict_notes,
    )
    gpu = (results.environment.get("gpu") or {}).get("name")
    base7 = contenders[0].label.removeprefix(BASE_PREFIX)
    out_dir = args.out or default_out_dir(grid.name, gpu, base7, head7, datetime.now(timezone.utc))
    comparison = write_report(results, out_dir, args.min_change)
    unrun = [v for v in comparison.timing if v.verdict == compare.NO_DATA]
    if unrun:  # a BASE that did not build, or a side that failed every call: no A/B was made there
        print(
            f"ab: {len(unrun)} of {len(comparison.timing)} (case, mode) pairs have no samples on a side "
            f"({unrun[0].case_id} {unrun[0].mode}: {unrun[0].decision.reason}); the rows say why",
            file=sys.stderr,
        )
        return 2
    if args.slowdown:
        ok, text = slowdown_selfcheck([v.verdict for v in comparison.timing])
        print(text)
        return 0 if ok else 1
    return 1 if comparison.regressions else 0


def main(args: argparse.Namespace) -> int:
    if sum(x is not None for x in (args.base, args.base_define, args.slowdown)) != 1:
        print(
            "ab: give one of --base REV (A/B against a revision), --base-define NAME[=VALUE] (against "
            "this checkout built with extra macros) or --slowdown F (self-check)",
            file=sys.stderr,
        )
        return 2
    try:
        return run_ab(args)
    except (ABError, compare.CompareError, GridError, GpuLockError) as e:
        print(f"ab: {e}", file=sys.stderr)
        return 2


def _slowdown(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1.0 < value <= 3.0:
        raise argparse.ArgumentTypeError(f"--slowdown must be a factor in (1, 3] such as 1.10, got {text!r}")
    return value


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"--rounds must be an integer >= 2 (each side goes first once), got {text!r}"
        )
    return value


def register_cli(sub: Any) -> None:
    p = sub.add_parser(
        "ab",
        help="time another revision's kernel against this checkout's, interleaved on one GPU",
        description=__doc__.split("\n\n", 1)[0],
    )
    p.add_argument("--base", metavar="REV", help="the git revision whose kernel is BASE")
    p.add_argument(
        "--base-define",
        type=parse_define,
        action="append",
        metavar="NAME[=VALUE]",
        help="BASE is this checkout built with -DNAME[=VALUE] added (repeatable), e.g. VA_SOME_SWITCH",
    )
    p.add_argument(
        "--slowdown",
        type=_slowdown,
        metavar="F",
        help="self-check instead: HEAD against HEAD slowed by factor F (e.g. 1.10); the gate must catch it",
    )
    p.add_argument("--grid", default="quick", help="quick (default) | default | full | PATH.toml")
    p.add_argument(
        "--impl",
        default=KERNEL_IMPL,
        choices=[KERNEL_IMPL],
        help="the implementation under test: the one built from this repository's kernel package",
    )
    p.add_argument(
        "--rounds",
        type=_rounds,
        default=DEFAULT_ROUNDS,
        help=f"interleaved rounds (default {DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--min-change",
        type=compare.parse_min_change,
        default=compare.DEFAULT_MIN_CHANGE,
        help=f"minimum effect for SLOWER/FASTER (default {compare.DEFAULT_MIN_CHANGE})",
    )
    p.add_argument(
        "--out",
        type=nonempty_path("the run's folder (created if missing)"),
        default=None,
        help="output folder (default reports/<time>-ab-...)",
    )
    p.set_defaults(func=main)
