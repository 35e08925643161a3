"""Compare two runs: a verdict per case from the raw samples, and every parity regression.

    python -m harness compare BASE HEAD [--force] [--out DIR] [--min-change 0.03] [--impls a,b]
    python -m harness compare --history reports/ [--gate-impls 'verify-attn-cuda*']

Each side is a ``results.json``, a report folder, or a git revision. A revision stands for its
committed report under ``reports/``: the newest run (by ``created_utc``) of the same GPU model,
kind and grid as the other side; when both sides are revisions, every (GPU model, kind, grid)
group present at both is compared. ``--history DIR`` reads the results files under DIR that git
tracks or would track (committed, staged, or new and not ignored: in a clean checkout, the
committed runs; every file under DIR outside a git work tree) and, for every such group, compares
its newest run with the newest run of another commit (with the newest before it when every run is
of one commit: a re-run of a commit must not stand in for the commit before it, or a regression
judged against a re-run of itself would read SAME); a group of one run is judged alone, against
nothing: each failing parity row of it counts. Runs of kind "ab" hold both sides in one file and
are left out there.

Timing verdict per matching case (same case_id, implementation and mode), from the raw samples
(``SweepRow.samples_ms``), never from a mean. With ``change = median(HEAD) / median(BASE) - 1``,
``spread(side) = q3 / q1 - 1`` and the minimum effect ``m`` (``--min-change``, default 3 %):

    SLOWER   q1(HEAD) > q3(BASE)  and  change > +m           and  Mann-Whitney p < 0.01
    FASTER   q1(BASE) > q3(HEAD)  and  change < -m / (1 + m)  and  Mann-Whitney p < 0.01
    NOISY    neither, and spread(BASE) > m or spread(HEAD) > m, or the change is beyond those
             bounds (undecided), or fewer than 6 samples on a side
    SAME     otherwise: both sides tight enough to have shown a change of m, and none shown
    NO DATA  a side has no usable samples (a regression when BASE had them and HEAD has not);
             a sample that is not finite and positive is left out (and counted in the reason)

Why these conditions and thresholds:

- GPU timings have outliers at both ends: preemption, clock changes and cache misses add time,
  and a board near its power cap runs some samples in a faster power state (in 37122e8's default
  run a tenth of P=262k H=128 T=64's samples sit ~10 % below the rest). So the interval condition
  uses the quartiles, not the extremes: HEAD's middle half must lie wholly above BASE's. A
  regression shifts the whole distribution; a few outliers at either end do not decide it.
  (The rule first read ``min(HEAD) > q3(BASE)`` with ``spread = q3 / min - 1``: a few fast
  samples in BASE then let a 10 % slowdown read NOISY, which does not gate.)
- For a pure shift ``HEAD = BASE * (1 + c)`` the interval condition holds exactly when
  ``c > spread(BASE)`` (``c > spread(HEAD)`` for FASTER). A side whose spread exceeds ``m`` could
  therefore hide a change of ``m``: that is what NOISY means. It is not a failure; it says this
  run cannot vouch for the case at that effect size. SAME is claimed only when it could.
- The minimum effect separates regressions from drift that the samples of one run cannot see:
  boards of one GPU model and boost clocks differ by 1-2 % between runs, so a smaller change is
  not attributed to the code; 3 % sits above that drift and well below the 10 % slowdown the gate
  must catch (a 10 % change is decided whenever both spreads are under 10 %). The bound is
  symmetric in ratio: HEAD 3 % slower than BASE is BASE 2.9 % faster than HEAD, so swapping the
  two sides swaps SLOWER and FASTER and never turns one into SAME.
- The Mann-Whitney U test (two-sided, normal approximation with tie correction and continuity
  correction; samples are stored rounded, so ties are common) guards the small-sample case, where
  a few samples can fall apart by chance. Alpha 0.01 over the hundreds of cases of a sweep gives
  few chance hits, and a chance hit must also pass the interval and effect conditions. Where the
  two samples separate completely (every HEAD sample above every BASE one, or below) p is the
  exact permutation probability of that, 2 / C(n1 + n2, n1), which the normal approximation
  overstates for small samples: the sweep gives a slow call as few as 3 samples (its one-second
  budget), so a call 10x slower has the fewest, and 3 against 10 separated reads p = 0.007 exactly
  (0.014 approximated). SLOWER and FASTER need only p < 0.01, for any sizes; SAME needs six
  samples a side, since the quartiles of fewer cannot vouch that a change of m would have shown.

Parity regressions always count: a row that fails or errs in HEAD where it did not in BASE (a
new row that fails included), or whose target tokens or accepted path stop matching. Mutation
controls (``mutant:<name>`` rows) are expected to fail; one that BASE caught and HEAD passes or
errs on is the regression (a mutant counts as caught only when it fails, as ``nox -s parity``
counts it), and so is one that HEAD catches on no bundle.
A row that becomes unavailable is listed with its reason but does not gate: the reason is an
environment difference (a package or device missing), not a result.

Beside the verdicts, each series of prefix lengths fitted in both runs (:mod:`harness.scaling`)
shows its fixed cost BASE -> HEAD with the change's standard error, and its steady % of floor:
whether a change moved what every call pays or the rate per key. Shown, never gated: the verdicts
decide.

Like with like: BASE and HEAD of different GPU models or kinds are refused unless ``--force``;
a run's grid (its case set) is its ``--grid`` (parity: ``--bundles``) plus whatever narrowed it:
a sweep's ``--impls``, ``--modes``, ``--case-filter`` or ``--shard``, a parity run's ``--impls``
or the absence of ``--mutations``. A narrowed run thus forms its own group in ``--history`` and is
never taken for the newest run of the whole grid, whose rows it lacks (a row of BASE missing from
HEAD is listed, BASE ONLY, and does not gate, unless HEAD has no timed rows, or no parity rows, at
all: such a run vouches for nothing, and every BASE row counts against it; between runs of one
grid, an implementation with no timed row in HEAD counts the same way, so that ``--gate-impls``
cannot gate nothing). A kernel built other than by default (extra nvcc flags or a
``VERIFY_ATTN_ARCHS`` of another arch list: ``build_flags.tuning``) makes a run of its own grid
too, and ``BASE HEAD`` of different builds are refused unless ``--force``;
timings are compared only when both runs had a GPU (a CPU-only parity run compares parity only).

Gated implementations: by default every SLOWER counts. ``--gate-impls a,b`` keeps every verdict
in the table but counts timing regressions only for those implementations (names, or shell
patterns such as ``verify-attn-cuda*``); the others are listed as "not gated". CI gates the
history on the project's own kernel this way: the reference implementations (SGLang's Triton
kernel, the float64 oracle) do not change between our commits, so their timing changes measure
the box, not the commit (two lent H200s of one model ran SGLang 6 % apart). Parity regressions
count for every implementation either way.

Waivers: ``--history DIR`` reads ``DIR/waivers.toml`` when it exists (``--waivers FILE`` names
another). A waiver accepts named SLOWER timing verdicts of one pair of runs: its BASE and HEAD
revisions, GPU model, kind, grid and implementation, and the (case, mode) pairs, each with the
reason and the evidence (e.g. a same-GPU ``harness ab`` report). A waived verdict is shown as
"SLOWER (waived)" and its reason is printed; it is not counted. A waiver matches only its own pair
of runs, so it cannot hide a later regression; it never applies to parity, and an entry that names
a case which is not SLOWER in its pair is reported as unused. Why it exists: two runs on two
lent boards of one model can differ by more than the minimum effect where the GPU caps its power
(the heavy cases on an H200), and a same-GPU A/B cannot always vouch either way there (its
spread is the power cap's); a person then decides, in a reviewed file, with the numbers beside it.

Exit status: 1 on any (gated) SLOWER or parity regression, 2 when the inputs cannot be compared
(``--history`` over a folder with no results file at all included) or the HTML diff or its
verdicts file cannot be written, else 0 (``--history`` with runs but no group of two: nothing to
compare). The terminal gets a table; an HTML diff and, beside it under the same name, the
verdicts as JSON (:func:`verdicts_record`: every verdict with its numbers and whether it counts,
for a CI system to post or track) are written atomically to ``--out``, one pair per comparison.
"""

from __future__ import annotations

import argparse
import fnmatch
import html
import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from harness.cli import check_out_dir, nonempty_path, shown
from harness.results import (
    ParityRow,
    Results,
    ResultsError,
    SweepRow,
    atomic_write_text,
    is_results_file,
    load_results,
    one_per_run,
    results_files_under,
    results_from_bytes,
)
from harness.scaling import TITLE, FitChange, ScalingFit, change_records, fit_changes, text_rows
from harness.text import columns

DEFAULT_MIN_CHANGE = 0.03
ALPHA = 0.01
MIN_SAMPLES = 6
DEFAULT_OUT = Path("reports/_work/compare")
REPORTS_FOLDER = "reports"
WAIVERS_FILE = "waivers.toml"  # read from the --history folder

SLOWER, FASTER, NOISY, SAME, NO_DATA = "SLOWER", "FASTER", "NOISY", "SAME", "NO DATA"
REGRESSED, FIXED, STILL_FAILING, UNAVAILABLE = "REGRESSED", "FIXED", "STILL FAILING", "UNAVAILABLE"
BASE_ONLY, HEAD_ONLY = "BASE ONLY", "HEAD ONLY"
MUTANT_PREFIX = "mutant:"
# Display order: what needs attention first.
SEVERITY = (
    REGRESSED,
    SLOWER,
    NO_DATA,
    NOISY,
    STILL_FAILING,
    UNAVAILABLE,
    HEAD_ONLY,
    BASE_ONLY,
    FIXED,
    FASTER,
    SAME,
)


class CompareError(ValueError):
    """Inputs that cannot be compared: unknown revision, no matching run, unlike runs."""


# ---------------------------------------------------------------------------------------------
# Statistics


@dataclass(frozen=True)
class SampleStats:
    n: int
    min_ms: float
    q1_ms: float
    median_ms: float
    q3_ms: float
    max_ms: float

    @property
    def spread(self) -> float:
        """q3 / q1 - 1: the smallest relative shift the interval condition can resolve."""
        return self.q3_ms / self.q1_ms - 1.0


def sample_stats(samples_ms: Sequence[float]) -> SampleStats:
    """Min, quartiles (linear interpolation) and max of a non-empty sample."""
    x = np.asarray(samples_ms, dtype=np.float64)
    if x.size == 0:
        raise ValueError("samples_ms is empty; expected at least one sample")
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return SampleStats(int(x.size), float(x.min()), float(q1), float(med), float(q3), float(x.max()))


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``; tied values share the mean of the ranks they span."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[inverse.reshape(-1)]


def mann_whitney_u(base: Sequence[float], head: Sequence[float]) -> tuple[float, float]:
    """(U, p): U counts the (base, head) pairs where head is larger (ties count one half);
    p is two-sided, from the normal approximation with tie and continuity corrections.
    p is 1 when every sample is equal (no ordering to test)."""
    a = np.asarray(base, dtype=np.float64)
    b = np.asarray(head, dtype=np.float64)
    n1, n2 = a.size, b.size
    if n1 == 0 or n2 == 0:
        raise ValueError(f"both samples must be non-empty, got {n1} base and {n2} head values")
    pooled = np.concatenate([a, b])
    ranks = average_ranks(pooled)
    u = float(ranks[n1:].sum() - n2 * (n2 + 1) / 2.0)
    n = n1 + n2
    _, counts = np.unique(pooled, return_counts=True)
    tie_term = float((counts.astype(np.float64) ** 3 - counts).sum()) / (n * (n - 1))
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if variance <= 0.0:
        return u, 1.0
    z = max(abs(u - n1 * n2 / 2.0) - 0.5, 0.0) / math.sqrt(variance)
    return u, math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class TimingDecision:
    verdict: str
    reason: str
    regression: bool = False
    base: SampleStats | None = None
    head: SampleStats | None = None
    change: float | None = None  # median(HEAD) / median(BASE) - 1
    p_value: float | None = None


def _usable(samples: Sequence[float]) -> list[float]:
    """The samples that are finite and positive (a time of 0 is a clock's resolution, not a time)."""
    return [s for s in samples if math.isfinite(s) and s > 0]


def separated_p(base: Sequence[float], head: Sequence[float]) -> float | None:
    """The exact two-sided p of two samples that separate completely (each value of one above
    each of the other): 2 / C(n1 + n2, n1), the chance of either extreme ordering; None when they
    overlap or touch."""
    if min(head) > max(base) or min(base) > max(head):
        return min(1.0, 2.0 / math.comb(len(base) + len(head), len(base)))
    return None


def timing_decision(
    base_ms: Sequence[float], head_ms: Sequence[float], *, min_change: float = DEFAULT_MIN_CHANGE
) -> TimingDecision:
    """The verdict of the module docstring for one case, from the two raw samples."""
    if not 0.0 < min_change < 1.0:
        raise ValueError(f"min_change must be a fraction in (0, 1), got {min_change!r}")
    usable_base, usable_head = _usable(base_ms), _usable(head_ms)
    if not (usable_base and usable_head):
        missing = [name for name, s in (("BASE", usable_base), ("HEAD", usable_head)) if not s]
        return TimingDecision(
            NO_DATA,
            f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no usable samples "
            "(none that is finite and positive)",
            regression=bool(usable_base),
        )
    dropped = len(base_ms) - len(usable_base) + len(head_ms) - len(usable_head)
    bs, hs = sample_stats(usable_base), sample_stats(usable_head)
    change = hs.median_ms / bs.median_ms - 1.0
    _, p = mann_whitney_u(usable_base, usable_head)
    exact = separated_p(usable_base, usable_head)
    p = p if exact is None else exact
    decision = _decide(bs, hs, change, p, min_change)
    if dropped:
        decision = replace(
            decision, reason=f"{decision.reason} ({dropped} samples not finite and positive left out)"
        )
    return decision


def _decide(bs: SampleStats, hs: SampleStats, change: float, p: float, min_change: float) -> TimingDecision:
    common = {"base": bs, "head": hs, "change": change, "p_value": p}
    limit = f"{100 * min_change:.3g} %"
    faster_bound = -min_change / (1.0 + min_change)  # the same ratio as +min_change, the other way
    if hs.q1_ms > bs.q3_ms and change > min_change and p < ALPHA:
        return TimingDecision(
            SLOWER,
            f"HEAD q1 {hs.q1_ms:.4g} ms > BASE q3 {bs.q3_ms:.4g} ms, median {100 * change:+.1f} % "
            f"beyond {limit}, p = {p:.2g}",
            regression=True,
            **common,
        )
    if bs.q1_ms > hs.q3_ms and change < faster_bound and p < ALPHA:
        return TimingDecision(
            FASTER,
            f"BASE q1 {bs.q1_ms:.4g} ms > HEAD q3 {hs.q3_ms:.4g} ms, median {100 * change:+.1f} % "
            f"beyond {100 * faster_bound:.3g} %, p = {p:.2g}",
            **common,
        )
    wide = [
        f"{name} spread {100 * s.spread:.1f} %"
        for name, s in (("BASE", bs), ("HEAD", hs))
        if s.spread > min_change
    ]
    if min(bs.n, hs.n) < MIN_SAMPLES:
        return TimingDecision(
            NOISY, f"too few samples to call SAME ({bs.n} vs {hs.n}, need {MIN_SAMPLES})", **common
        )
    if wide:
        return TimingDecision(NOISY, f"{', '.join(wide)} > {limit}: a change of {limit} could hide", **common)
    if change > min_change or change < faster_bound:
        return TimingDecision(
            NOISY,
            f"median {100 * change:+.1f} % but the samples do not separate (p = {p:.2g})",
            **common,
        )
    return TimingDecision(SAME, f"median {100 * change:+.1f} %, within {limit}", **common)


# ---------------------------------------------------------------------------------------------
# Verdicts over two runs


def capped_samples_text(base: SweepRow | None, head: SweepRow | None) -> str:
    """How many of each side's samples NVML's readings showed capped, where either side's were
    read one by one (``throttled_samples``): ``capped samples: BASE -, HEAD 12/40`` ("-": not
    read so, or no row); "" where neither side's were. Where both were, and one side's were
    flagged by a cap alone while the other's asked for a lowered SM clock too
    (``throttle_clock_line_mhz``), it says which: the first counts more samples for the same
    board state."""

    counts = [None if r is None else r.capped_count for r in (base, head)]
    if counts == [None, None]:
        return ""
    text = "capped samples: BASE {}, HEAD {}".format(*(c or "-" for c in counts))
    if None not in counts:
        alone = [r is not None and r.throttle_clock_line_mhz is None for r in (base, head)]
        if alone[0] != alone[1]:
            text += f" ({'BASE' if alone[0] else 'HEAD'}'s flagged by a cap alone, without the clock rule)"
    return text


@dataclass(frozen=True)
class TimingVerdict:
    case_id: str
    impl: str
    mode: str
    decision: TimingDecision
    throttled: bool = False  # either side's row was flagged as throttled
    # "capped samples: BASE -, HEAD 12/40" where either side's samples were read one by one
    # (capped_samples_text); "" where neither's were
    capped: str = ""

    @property
    def verdict(self) -> str:
        return self.decision.verdict

    @property
    def regression(self) -> bool:
        return self.decision.regression


@dataclass(frozen=True)
class ParityVerdict:
    bundle: str
    impl: str
    verdict: str
    reason: str
    regression: bool
    base: ParityRow | None
    head: ParityRow | None


def _fails(row: ParityRow) -> bool:
    return row.status in ("fail", "error")


def _caught(row: ParityRow) -> bool:
    """A mutation control is caught only when parity fails it, as ``parity.verdict`` counts: a
    mutant that errs has shown nothing about parity."""
    return row.status == "fail"


def _because(text: str, reason: str) -> str:
    return f"{text}: {reason}" if reason else text


def mutants_caught_nowhere(rows: Iterable[ParityRow]) -> set[str]:
    """Mutation controls that fail parity on no bundle of a run (DESIGN: each must fail on one)."""
    seen: dict[str, bool] = {}
    for r in rows:
        if r.impl.startswith(MUTANT_PREFIX):
            seen[r.impl] = seen.get(r.impl, False) or _caught(r)
    return {impl for impl, caught in seen.items() if not caught}


def parity_verdict(base: ParityRow | None, head: ParityRow | None) -> ParityVerdict:
    """Verdict for one (bundle, impl) parity row present on at least one side."""
    row = head if head is not None else base
    if row is None:
        raise ValueError("parity_verdict needs a row on at least one side, got none")
    bundle, impl = row.bundle, row.impl

    def make(verdict: str, reason: str, regression: bool = False) -> ParityVerdict:
        return ParityVerdict(bundle, impl, verdict, reason, regression, base, head)

    if impl.startswith(MUTANT_PREFIX):
        # A mutation control that BASE caught on this bundle and HEAD does not: parity lost the power
        # to see that bug here. (A mutant must fail on at least one bundle, not on each: some bundles
        # cannot show some mutations, e.g. a causal mask on a chain tree. `mutants_caught_nowhere`
        # checks the whole contract on HEAD.)
        if head is not None and head.status in ("pass", "error") and base is not None and _caught(base):
            what = "passes" if head.status == "pass" else _because("errs", head.reason)
            return make(REGRESSED, f"mutation control {what}: parity no longer detects this mutation", True)
    else:
        if head is not None and _fails(head) and (base is None or not _fails(base)):
            was = "a new row" if base is None else f"was {base.status}"
            return make(REGRESSED, _because(f"{head.status} ({was})", head.reason), True)
        for name in ("tokens_match", "path_match"):
            if (
                head is not None
                and getattr(head, name) is False
                and (base is None or getattr(base, name) is not False)
            ):
                return make(REGRESSED, f"{name} became False", True)
    if base is None:
        return make(HEAD_ONLY, f"only in HEAD ({head.status})")
    if head is None:
        return make(BASE_ONLY, f"only in BASE ({base.status})")
    if "unavailable" in (base.status, head.status) and base.status != head.status:
        side = head if head.status == "unavailable" else base
        return make(UNAVAILABLE, _because(f"{base.status} -> {head.status}", side.reason))
    if not impl.startswith(MUTANT_PREFIX):
        if _fails(base) and head.status == "pass":
            return make(FIXED, f"{base.status} -> pass")
        if _fails(base) and _fails(head):
            return make(STILL_FAILING, _because(f"{base.status} -> {head.status}", head.reason))
    return make(SAME, f"{base.status} -> {head.status}")


@dataclass(frozen=True)
class RunKey:
    """What makes two runs comparable: same GPU model, same kind, same grid (case set)."""

    gpu_model: str
    kind: str
    grid: str

    def __str__(self) -> str:
        return f"{self.kind} {self.grid} on {self.gpu_model}"


def gpu_model(results: Results) -> str:
    gpu = results.environment.get("gpu") if isinstance(results.environment, dict) else None
    return str(gpu.get("name")) if isinstance(gpu, dict) and gpu.get("name") else "cpu"


def _command_option(command: str, option: str) -> str | None:
    words = _command_words(command)
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(option + "="):
            return word[len(option) + 1 :]
    return None


# Options that run part of a grid: such a run's rows are a subset of the full run's.
SWEEP_NARROWING = ("--impls", "--modes", "--case-filter", "--shard")
PARITY_NARROWING = ("--impls",)


def _command_words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def narrowed_by(results: Results) -> list[str]:
    """What made a run cover less than its whole grid, from its command line: e.g.
    ``["--modes cold"]``, or ``["no --mutations"]`` for a parity run without the controls; and
    a kernel built other than by default (:func:`build_tuning`)."""
    command = results.command
    names = PARITY_NARROWING if results.kind == "parity" else SWEEP_NARROWING
    found = [f"{name} {value}" for name in names if (value := _command_option(command, name))]
    if results.kind == "parity" and "--mutations" not in _command_words(command):
        found.append("no --mutations")
    if tuning := build_tuning(results):
        found.append(f"built with {' '.join(tuning)}")
    return found


def build_tuning(results: Results) -> list[str]:
    """The kernel build's flags beyond its GPU's default (``kernel.build.tuning``, recorded in
    ``environment.build_flags.tuning``; none in runs recorded before it was)."""
    flags = (results.environment or {}).get("build_flags") if isinstance(results.environment, dict) else None
    tuning = flags.get("tuning") if isinstance(flags, dict) else None
    return [str(t) for t in tuning] if isinstance(tuning, list) else []


def run_grid(results: Results) -> str:
    """The case set a run covered, read from its command line: the sweep's ``--grid`` (a grid
    file counts by its stem; "default" when not given), the parity run's ``--bundles``, and in
    brackets what narrowed it (:func:`narrowed_by`)."""
    if results.kind == "parity":
        bundles = _command_option(results.command, "--bundles")
        name = ",".join(sorted(bundles.split(","))) if bundles else "all-bundles"
    else:
        grid = _command_option(results.command, "--grid")
        name = "default" if grid is None else Path(grid).stem if grid.endswith(".toml") else grid
        # A tensor-parallel run times other cases (H/N heads per rank) than a one-GPU run of the grid.
        tp = _command_option(results.command, "--tp")
        name = f"{name}-tp{tp}" if tp else name
    narrowed = narrowed_by(results)
    return f"{name} [{', '.join(narrowed)}]" if narrowed else name


def run_key(results: Results) -> RunKey:
    return RunKey(gpu_model(results), results.kind, run_grid(results))


def sha7_of(results: Results) -> str:
    """The run's commit in seven digits, ``+dirty`` for a tree with changes; "nogit" without one."""
    git = results.git if isinstance(results.git, dict) else {}
    sha = git.get("sha")
    return f"{str(sha)[:7]}{'+dirty' if git.get('dirty') else ''}" if sha else "nogit"


@dataclass(frozen=True)
class Side:
    """One run as it enters a comparison: where it came from, and its results."""

    label: str  # e.g. "reports/x/results.json" or "main (1a2b3c4): reports/x/results.json"
    results: Results
    revision: str | None = None  # the git revision it was read from, if any

    @property
    def key(self) -> RunKey:
        return run_key(self.results)

    @property
    def sha7(self) -> str:
        return sha7_of(self.results)


@dataclass(frozen=True)
class Comparison:
    base: Side
    head: Side
    min_change: float
    timing: tuple[TimingVerdict, ...]
    parity: tuple[ParityVerdict, ...]
    notes: tuple[str, ...] = ()
    environment_diff: tuple[tuple[str, str, str], ...] = ()  # (field, base value, head value)
    # timing regressions count only for implementations these names or shell patterns match
    # (fnmatch, e.g. "verify-attn-cuda*"); None: all
    gated_impls: tuple[str, ...] | None = None
    waived: tuple[tuple[str, str, str], ...] = ()  # (case_id, impl, mode) of waived SLOWER verdicts
    waiver_notes: tuple[str, ...] = ()  # each waiver used (reason, evidence) or with unused entries
    # the series of prefix lengths fitted in both runs (harness/scaling.py): shown, never gated
    scaling: tuple[FitChange, ...] = ()

    def is_gated(self, v: TimingVerdict) -> bool:
        return self.gated_impls is None or any(fnmatch.fnmatchcase(v.impl, g) for g in self.gated_impls)

    def is_waived(self, v: TimingVerdict) -> bool:
        return v.verdict == SLOWER and (v.case_id, v.impl, v.mode) in self.waived

    def is_counted(self, v: TimingVerdict | ParityVerdict) -> bool:
        """Whether the exit status counts ``v``: a parity regression always, a timing one when its
        implementation is gated and no waiver accepts it."""
        if isinstance(v, ParityVerdict):
            return v.regression
        return v.regression and self.is_gated(v) and not self.is_waived(v)

    @property
    def regressions(self) -> list[TimingVerdict | ParityVerdict]:
        return [v for v in (*self.parity, *self.timing) if self.is_counted(v)]

    @property
    def ungated_regressions(self) -> list[TimingVerdict]:
        """Timing regressions of implementations outside ``gated_impls``: shown, not counted."""
        return [v for v in self.timing if v.regression and not self.is_gated(v)]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in (*self.parity, *self.timing):
            out[v.verdict] = out.get(v.verdict, 0) + 1
        return {k: out[k] for k in SEVERITY if k in out}


def check_comparable(base: Side, head: Side, *, force: bool) -> None:
    """Raise CompareError when the runs are unlike (GPU model or kind) and ``force`` is off."""
    if force:
        return
    bk, hk = base.key, head.key
    if bk.gpu_model != hk.gpu_model:
        raise CompareError(
            f"BASE ran on {bk.gpu_model!r} and HEAD on {hk.gpu_model!r}: timings of different GPU models "
            "are not comparable (pass --force to compare anyway)"
        )
    if bk.kind != hk.kind:
        raise CompareError(
            f"BASE is a {bk.kind!r} run and HEAD a {hk.kind!r} run; expected runs of one kind (or pass --force)"
        )
    bt, ht = build_tuning(base.results), build_tuning(head.results)
    if bt != ht:
        raise CompareError(
            f"BASE's kernel was built with {' '.join(bt) or 'the default flags'} and HEAD's with "
            f"{' '.join(ht) or 'the default flags'}: timings of different builds are not like with like "
            "(pass --force to compare anyway)"
        )


def _flatten(d: Any, prefix: str = "") -> dict[str, str]:
    if not isinstance(d, dict):
        return {prefix: d if isinstance(d, str) else json.dumps(d, sort_keys=True)} if prefix else {}
    out: dict[str, str] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def environment_diff(base: Results, head: Results) -> tuple[tuple[str, str, str], ...]:
    """Environment fields that differ (versions, driver, clocks, board): the usual suspects."""
    b, h = _flatten(base.environment), _flatten(head.environment)
    return tuple(
        (k, b.get(k, "-"), h.get(k, "-")) for k in sorted(b.keys() | h.keys()) if b.get(k) != h.get(k)
    )


# Measured ceilings further apart than this get a note: verdicts compare times, but each run's
# "% of floor" is against its own ceilings (lent H200s measured 740-791 TFLOP/s for one matmul).
CEILINGS_NOTE_SHIFT = 0.02
_CEILING_FIELDS = (
    ("bf16_tflops", "bf16 tensor peak", "TFLOP/s"),
    ("copy_bandwidth_gbs", "copy bandwidth", "GB/s"),
)


def ceilings_note(base: Results, head: Results, *, shift: float = CEILINGS_NOTE_SHIFT) -> str | None:
    """A note when the two runs measured ceilings more than ``shift`` apart (relative), else None."""
    if not base.ceilings or not head.ceilings:
        return None
    parts, moved = [], False
    for field, label, unit in _CEILING_FIELDS:
        b, h = base.ceilings.get(field), head.ceilings.get(field)
        if not isinstance(b, (int, float)) or not isinstance(h, (int, float)) or b <= 0:
            continue
        change = h / b - 1.0
        moved = moved or abs(change) > shift
        parts.append(f"{label} {b:.0f} -> {h:.0f} {unit} ({change:+.1%})")
    if not moved:
        return None
    return (
        "measured ceilings differ: " + ", ".join(parts) + "; verdicts compare times, but each run's "
        "% of floor is against its own ceilings, so % of floor moves by the ceilings' change too"
    )


# The timing's own floor (an empty kernel between the events, harness/roofline.py) further apart
# than this between the runs gets a note: the shortest calls' times move by about the difference.
EMPTY_KERNEL_NOTE_SHIFT = 0.10


def empty_kernel_note(base: Results, head: Results, *, shift: float = EMPTY_KERNEL_NOTE_SHIFT) -> str | None:
    """A note when both runs timed the empty kernel and its times differ by more than ``shift``."""
    b, h = ((r.ceilings or {}).get("empty_kernel_ms") for r in (base, head))
    if not isinstance(b, (int, float)) or not isinstance(h, (int, float)) or b <= 0 or h <= 0:
        return None
    change = h / b - 1.0
    if abs(change) <= shift:
        return None
    return (
        f"an empty kernel between the events took {b * 1e3:.2f} -> {h * 1e3:.2f} us ({change:+.0%}): "
        "the shortest calls' times move by about that difference with the box, not the code"
    )


def _index(rows: Iterable[Any], key: Any, side: str) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for row in rows:
        k = key(row)
        if k in out:
            raise CompareError(f"{side} has two rows for {k}; expected one per case")
        out[k] = row
    return out


def compare_results(
    base: Side,
    head: Side,
    *,
    min_change: float = DEFAULT_MIN_CHANGE,
    impls: Sequence[str] | None = None,
    gated_impls: Sequence[str] | None = None,
) -> Comparison:
    """Verdicts for every parity row and timed case of two runs (``impls`` restricts both);
    ``gated_impls`` limits which implementations' timing regressions count (None: all)."""
    keep = (lambda impl: impl in impls) if impls else (lambda impl: True)
    notes: list[str] = []
    if base.key.grid != head.key.grid:
        notes.append(
            f"grids differ: BASE {base.key.grid!r}, HEAD {head.key.grid!r}; unmatched cases are listed"
        )

    def pkey(r: ParityRow) -> tuple[str, str]:
        return (r.bundle, r.impl)

    bp = _index((r for r in base.results.parity if keep(r.impl)), pkey, "BASE")
    hp = _index((r for r in head.results.parity if keep(r.impl)), pkey, "HEAD")
    parity = tuple(parity_verdict(bp.get(k), hp.get(k)) for k in _ordered_keys(bp, hp))
    nowhere = mutants_caught_nowhere(hp.values())
    parity = tuple(
        replace(v, verdict=REGRESSED, reason="mutation control caught on no bundle in HEAD", regression=True)
        if v.impl in nowhere and v.head is not None
        else v
        for v in parity
    )
    if bp and not hp:
        # A run with no parity rows at all vouches for nothing (every BASE row would read BASE ONLY).
        notes.append("HEAD has no parity rows: every BASE row counts as a regression")
        parity = tuple(
            replace(v, verdict=REGRESSED, reason="HEAD has no parity rows", regression=True) for v in parity
        )

    timing: list[TimingVerdict] = []
    scaling: tuple[FitChange, ...] = ()
    if "cpu" in (base.key.gpu_model, head.key.gpu_model):
        if base.results.sweep or head.results.sweep:
            notes.append("timings are compared only between GPU runs; a CPU-only run compares parity only")
    else:

        def tkey(r: SweepRow) -> tuple[str, str, str]:
            return (r.case_id, r.impl, r.mode)

        bt = _index((r for r in base.results.sweep if keep(r.impl)), tkey, "BASE")
        ht = _index((r for r in head.results.sweep if keep(r.impl)), tkey, "HEAD")
        if bt and not ht:
            notes.append("HEAD has no timed rows: every BASE row counts as NO DATA")
        # Runs of one grid time the same implementations: one of them gone from HEAD altogether
        # vouches for none of its cases (a gate on it would otherwise read "no regression").
        head_impls = {impl for _, impl, _ in ht}
        gone = (
            sorted({impl for _, impl, _ in bt} - head_impls) if base.key.grid == head.key.grid and ht else []
        )
        if gone:
            notes.append(
                f"HEAD has no timed rows of {', '.join(gone)}: each of their BASE rows counts as NO DATA"
            )
        for k in _ordered_keys(bt, ht):
            b, h = bt.get(k), ht.get(k)
            if h is None and not ht:
                decision = TimingDecision(NO_DATA, "HEAD has no timed rows at all", regression=True)
            elif h is None and k[1] in gone:
                decision = TimingDecision(NO_DATA, f"HEAD has no timed rows of {k[1]}", regression=True)
            elif b is None or h is None:
                decision = TimingDecision(HEAD_ONLY if b is None else BASE_ONLY, "case run on one side only")
            else:
                decision = timing_decision(b.samples_ms, h.samples_ms, min_change=min_change)
            throttled = any(r is not None and r.throttled for r in (b, h))
            capped = capped_samples_text(b, h)
            timing.append(TimingVerdict(*k, decision=decision, throttled=throttled, capped=capped))
        scaling = tuple(
            fit_changes(
                (r for r in base.results.sweep if keep(r.impl)),
                (r for r in head.results.sweep if keep(r.impl)),
            )
        )
        if any(v.throttled and v.verdict in (SLOWER, FASTER) for v in timing):
            notes.append(
                "some decided cases were throttled on one side (marked): check clocks before trusting them"
            )
        for note in (
            ceilings_note(base.results, head.results),
            empty_kernel_note(base.results, head.results),
        ):
            if note:
                notes.append(note)
    return Comparison(
        base=base,
        head=head,
        min_change=min_change,
        timing=tuple(timing),
        parity=parity,
        notes=tuple(notes),
        environment_diff=environment_diff(base.results, head.results),
        gated_impls=None if gated_impls is None else tuple(gated_impls),
        scaling=scaling,
    )


def _ordered_keys(base: dict[Any, Any], head: dict[Any, Any]) -> list[Any]:
    """HEAD's order, then keys only BASE has, in BASE's order."""
    return [*head, *(k for k in base if k not in head)]


# ---------------------------------------------------------------------------------------------
# Finding runs: paths, git revisions, history


def _git_bytes(repo: Path, *args: str) -> bytes:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except FileNotFoundError as e:
        raise CompareError("git is not installed; a git revision cannot be resolved") from e
    if proc.returncode != 0:
        raise CompareError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _git(repo: Path, *args: str) -> str:
    return _git_bytes(repo, *args).decode()


def repo_root(start: Path) -> Path:
    return Path(_git(start, "rev-parse", "--show-toplevel").strip())


def _run_git(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise CompareError("git is not installed; revisions and the committed history cannot be read") from e


def resolve_revision(repo: Path, rev: str) -> str | None:
    """The full commit sha of ``rev``, or None when it names no commit."""
    proc = _run_git(["-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"])
    return proc.stdout.strip() if proc.returncode == 0 else None


def committed_runs(repo: Path, rev: str, folder: str = REPORTS_FOLDER) -> list[Side]:
    """Every results file (plain or compressed) committed under ``folder`` at ``rev``, read with
    ``git show``."""
    sha = resolve_revision(repo, rev)
    if sha is None:
        raise CompareError(f"{rev!r} is not a commit of the repository at {repo}")
    listing = _git(repo, "ls-tree", "-r", "--name-only", "-z", sha, "--", folder)
    sides = []
    for path in map(str, one_per_run(Path(p) for p in listing.split("\0") if p and is_results_file(p))):
        source = f"{rev} ({sha[:7]}): {path}"
        results = results_from_bytes(_git_bytes(repo, "show", f"{sha}:{path}"), source)
        sides.append(Side(source, results, revision=rev))
    return sides


def created_at(side: Side) -> datetime:
    """``created_utc`` as an aware datetime (a trailing Z and a missing offset both mean UTC)."""
    text = str(side.results.created_utc).strip()
    try:
        t = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError as e:
        raise ResultsError(f"{side.label}: created_utc {text!r} is not an ISO-8601 time") from e
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def newest_by_key(sides: Iterable[Side]) -> dict[RunKey, list[Side]]:
    """Runs grouped by RunKey, newest first within a group ("ab" runs left out)."""
    groups: dict[RunKey, list[Side]] = {}
    for side in sides:
        if side.results.kind != "ab":
            groups.setdefault(side.key, []).append(side)
    return {k: sorted(v, key=created_at, reverse=True) for k, v in groups.items()}


def tracked_results(folder: Path) -> list[Path]:
    """Results files (plain or compressed) under ``folder`` as the working tree has them, among
    those git tracks or would track (committed, staged, or new and not ignored); every one when
    outside a work tree. A tracked file deleted from the working tree is left out, so a run whose
    ``results.json`` ``report --prune`` has just compressed is read from its new
    ``results.json.gz`` before either change is committed. In a clean checkout (CI's) these are
    exactly the committed runs."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CompareError(f"--history: {folder} is not a folder")
    proc = _run_git(
        [
            "-C",
            str(folder),
            "ls-files",
            "-z",
            "--full-name",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            ".",
        ]
    )
    if proc.returncode != 0:
        if "not a git repository" in proc.stderr:
            return results_files_under(folder)
        # Any other failure (a repository git refuses to read, e.g. of another owner) must not
        # widen the history to git-ignored scratch runs: it is an error, named.
        raise CompareError(f"--history {folder}: git ls-files failed: {proc.stderr.strip()}")
    root = repo_root(folder)
    paths = {root / p for p in proc.stdout.split("\0") if p and is_results_file(p)}
    return one_per_run(sorted(p for p in paths if p.is_file()))


def tracked_results_of_folder(root: Path, option: str) -> list[Path]:
    """:func:`tracked_results` of the reports folder a command's ``option`` names: ResultsError
    when it does not exist or is a file, or when git cannot list it."""
    root = Path(root)
    if not root.exists():
        raise ResultsError(f"{root}: no such file or folder")
    if not root.is_dir():
        raise ResultsError(f"{option} {root}: a file; expected the reports folder")
    try:
        return tracked_results(root)
    except CompareError as e:
        raise ResultsError(str(e)) from e


def _sha(side: Side) -> object:
    return side.results.git.get("sha") if isinstance(side.results.git, dict) else None


def history_groups(folder: Path) -> list[tuple[Side | None, Side]]:
    """(BASE, HEAD) for every group of runs under ``folder``: HEAD its newest run, BASE the newest
    run of another commit (a second run of HEAD's commit must not stand in for the commit before
    it: a regression judged against a re-run of itself would read SAME), or of HEAD's own commit
    when the group has no other; None when the group has one run (judged alone: its parity)."""
    sides = [Side(str(shown(p)), load_results(p)) for p in tracked_results(folder)]
    out: list[tuple[Side | None, Side]] = []
    for _, runs in sorted(newest_by_key(sides).items(), key=lambda kv: str(kv[0])):
        head, older = runs[0], runs[1:]
        base = next((r for r in older if _sha(r) != _sha(head)), older[0] if older else None)
        out.append((base, head))
    return out


def history_pairs(folder: Path) -> list[tuple[Side, Side]]:
    """(BASE, HEAD) of every group with two runs or more (:func:`history_groups`)."""
    return [(base, head) for base, head in history_groups(folder) if base is not None]


def nothing_before(head: Side) -> Side:
    """An empty BASE for a group's only run: compared with it, each failing parity row of the
    run is a new row that fails, and each mutation control it catches nowhere counts, as in
    any comparison; its timed rows are HEAD ONLY (a timing has nothing to be judged against)."""
    return Side("(no earlier run of this group)", replace(head.results, parity=[], sweep=[], unavailable=[]))


def untracked_note(folder: Path) -> str:
    """Where ``--history`` found no pair: how many results files under ``folder`` it left out
    because git ignores them (empty when none)."""
    left_out = len(results_files_under(folder)) - len(tracked_results(folder))
    if left_out <= 0:
        return ""
    return (
        f" ({left_out} results file(s) there are ignored by git and left out: the history reads "
        "committed or committable runs only; compare two runs as BASE HEAD instead)"
    )


def resolve_pairs(base_arg: str, head_arg: str, *, cwd: Path | None = None) -> list[tuple[Side, Side]]:
    """The (BASE, HEAD) runs named by two command-line arguments (see the module docstring)."""
    cwd = Path.cwd() if cwd is None else cwd
    sides: dict[str, Side | None] = {}
    revs: dict[str, str] = {}
    repo: Path | None = None
    for name, arg in (("BASE", base_arg), ("HEAD", head_arg)):
        if (cwd / arg).exists():
            sides[name] = Side(arg, load_results(cwd / arg))
            continue
        if repo is None:
            try:
                repo = repo_root(cwd)
            except CompareError as e:
                raise CompareError(f"{name}: {arg!r} is not a results file or report folder, and {e}") from e
        if resolve_revision(repo, arg) is None:
            gz = cwd / f"{arg}.gz"
            hint = (
                f" ({gz.name} is there: pass it, or its folder)"
                if arg.endswith(".json") and gz.is_file()
                else ""
            )
            raise CompareError(
                f"{name}: {arg!r} is neither a results.json, a report folder, nor a git revision of {repo}{hint}"
            )
        sides[name], revs[name] = None, arg
    if not revs:
        return [(sides["BASE"], sides["HEAD"])]  # type: ignore[list-item]
    assert repo is not None
    runs = {name: newest_by_key(committed_runs(repo, rev)) for name, rev in revs.items()}
    if len(revs) == 2:
        shared = [k for k in runs["HEAD"] if k in runs["BASE"]]
        if not shared:
            raise CompareError(
                f"no (GPU model, kind, grid) has a committed run under {REPORTS_FOLDER}/ at both "
                f"{base_arg!r} and {head_arg!r}"
            )
        return [(runs["BASE"][k][0], runs["HEAD"][k][0]) for k in sorted(shared, key=str)]
    (name, rev), other = next(iter(revs.items())), sides["HEAD" if "BASE" in revs else "BASE"]
    assert other is not None
    if other.results.kind == "ab":
        raise CompareError(
            f"{other.label} is an 'ab' run; a revision is matched only against parity or sweep runs"
        )
    match = runs[name].get(other.key)
    if not match:
        raise CompareError(f"{name}: {rev!r} has no committed run of {other.key} under {REPORTS_FOLDER}/")
    sides[name] = match[0]
    if match[0].results.to_json() == other.results.to_json():
        raise CompareError(
            f"{name}: {rev!r}'s newest committed run of {other.key} is {other.label} itself; "
            "nothing to compare (name an earlier revision)"
        )
    return [(sides["BASE"], sides["HEAD"])]  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------------
# Output


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _ms(s: SampleStats | None) -> str:
    return "-" if s is None else f"{s.median_ms:.4g}"


def _sorted(verdicts: Iterable[Any]) -> list[Any]:
    return sorted(verdicts, key=lambda v: SEVERITY.index(v.verdict))


SCALING_TITLE = f"{TITLE} (each run's fit, harness/scaling.py)"


def format_terminal(c: Comparison) -> str:
    """A plain-text report: header, counts, parity and timing tables (worst first), notes."""
    out = [
        f"compare {c.head.key}",
        f"  BASE {c.base.sha7}  {c.base.results.created_utc}  {c.base.label}",
        f"  HEAD {c.head.sha7}  {c.head.results.created_utc}  {c.head.label}",
        "  " + ", ".join(f"{k} {n}" for k, n in c.counts().items()) if c.counts() else "  nothing to compare",
    ]
    if c.parity:
        rows = [
            [
                v.verdict,
                v.bundle,
                v.impl,
                v.base.status if v.base else "-",
                v.head.status if v.head else "-",
                v.reason,
            ]
            for v in _sorted(c.parity)
        ]
        out += ["", "parity", columns(["verdict", "bundle", "impl", "base", "head", "reason"], rows)]
    if c.timing:
        rows = [
            [
                v.verdict + (" (throttled)" if v.throttled else "") + (" (waived)" if c.is_waived(v) else ""),
                v.case_id,
                v.impl,
                v.mode,
                _ms(v.decision.base),
                _ms(v.decision.head),
                _pct(v.decision.change),
                "-" if v.decision.p_value is None else f"{v.decision.p_value:.2g}",
                v.decision.reason + (f"; {v.capped}" if v.capped else ""),
            ]
            for v in _sorted(c.timing)
        ]
        header = ["verdict", "case", "impl", "mode", "base ms", "head ms", "change", "p", "reason"]
        out += ["", f"timing (median ms; minimum effect {100 * c.min_change:.3g} %)", columns(header, rows)]
    if c.scaling:
        out += ["", f"{SCALING_TITLE} (shown, not gated)", text_rows(change_records(c.scaling))]
    out += [f"note: {n}" for n in c.notes]
    if c.environment_diff:
        out += ["", "environment differences"] + [f"  {k}: {b} -> {h}" for k, b, h in c.environment_diff]
    regressions = c.regressions
    ungated = c.ungated_regressions
    if ungated:
        out += [
            "",
            f"not gated (only {', '.join(c.gated_impls or ())} is): {len(ungated)} SLOWER/NO DATA in "
            + ", ".join(sorted({v.impl for v in ungated})),
        ]
    out += ["", f"REGRESSIONS: {len(regressions)}" if regressions else "no regression"]
    out += list(c.waiver_notes)
    return "\n".join(out)


VERDICT_CSS = {
    SLOWER: "bad",
    REGRESSED: "bad",
    NO_DATA: "warn",
    NOISY: "warn",
    STILL_FAILING: "warn",
    UNAVAILABLE: "muted",
    HEAD_ONLY: "muted",
    BASE_ONLY: "muted",
    FIXED: "good",
    FASTER: "good",
    SAME: "",
}


def range_svg(base: SampleStats | None, head: SampleStats | None, width: int = 180) -> str:
    """Two box strips (min, q1, median, q3, max) on one axis: BASE above, HEAD below."""
    if base is None or head is None:
        return ""
    lo, hi = min(base.min_ms, head.min_ms), max(base.max_ms, head.max_ms)
    span = (hi - lo) or 1.0

    def x(v: float) -> float:
        return 4 + (width - 8) * (v - lo) / span

    parts = []
    for y, s, cls in ((5, base, "b"), (19, head, "h")):
        parts.append(
            f'<line x1="{x(s.min_ms):.1f}" x2="{x(s.max_ms):.1f}" y1="{y + 4}" y2="{y + 4}" class="w"/>'
        )
        parts.append(
            f'<rect x="{x(s.q1_ms):.1f}" y="{y}" width="{max(x(s.q3_ms) - x(s.q1_ms), 1):.1f}" height="8" class="{cls}"/>'
        )
        parts.append(
            f'<line x1="{x(s.median_ms):.1f}" x2="{x(s.median_ms):.1f}" y1="{y - 1}" y2="{y + 9}" class="m"/>'
        )
    title = html.escape(
        f"BASE {base.min_ms:.4g}..{base.max_ms:.4g} ms, HEAD {head.min_ms:.4g}..{head.max_ms:.4g} ms"
    )
    return (
        f'<svg class="range" width="{width}" height="32" viewBox="0 0 {width} 32" role="img">'
        f"<title>{title}</title>{''.join(parts)}</svg>"
    )


def render_html(c: Comparison) -> str:
    """The self-contained HTML diff (harness/templates/compare.html.j2)."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    timing = [
        {
            "v": v,
            "css": VERDICT_CSS[v.verdict],
            "base_ms": _ms(v.decision.base),
            "head_ms": _ms(v.decision.head),
            "change": _pct(v.decision.change),
            "spreads": " / ".join(
                "-" if s is None else f"{100 * s.spread:.1f}%" for s in (v.decision.base, v.decision.head)
            ),
            "n": " / ".join("-" if s is None else str(s.n) for s in (v.decision.base, v.decision.head)),
            "p": "-" if v.decision.p_value is None else f"{v.decision.p_value:.2g}",
            "svg": Markup(range_svg(v.decision.base, v.decision.head)),
        }
        for v in _sorted(c.timing)
    ]
    parity = [
        {
            "v": v,
            "css": VERDICT_CSS[v.verdict],
            "base_status": v.base.status if v.base else "-",
            "head_status": v.head.status if v.head else "-",
            "base_err": _err(v.base),
            "head_err": _err(v.head),
        }
        for v in _sorted(c.parity)
    ]
    return env.get_template("compare.html.j2").render(
        c=c,
        key=c.head.key,
        counts=[(k, n, VERDICT_CSS[k]) for k, n in c.counts().items()],
        regressions=len(c.regressions),
        timing=timing,
        parity=parity,
        scaling=change_records(c.scaling),
        scaling_title=SCALING_TITLE,
        min_change_pct=f"{100 * c.min_change:.3g}",
        alpha=ALPHA,
        min_samples=MIN_SAMPLES,
        rule=_rule_text(),
    )


def _rule_text() -> str:
    """The verdict rule as the module docstring states it (one source for both)."""
    start = __doc__.index("Timing verdict per matching case")
    return __doc__[start : __doc__.index("Why these conditions")].replace("``", "").strip()


def _err(row: ParityRow | None) -> str:
    return "-" if row is None or row.max_rel_err is None else f"{row.max_rel_err:.2e}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "x"


def html_name(c: Comparison) -> str:
    k = c.head.key
    return f"compare-{slug(k.kind)}-{slug(k.grid)}-{slug(k.gpu_model)}-{slug(c.base.sha7)}-vs-{slug(c.head.sha7)}.html"


def write_html(c: Comparison, out_dir: Path) -> Path:
    path = Path(out_dir) / html_name(c)
    atomic_write_text(path, render_html(c))
    return path


# ---------------------------------------------------------------------------------------------
# The verdicts as data, for CI systems that post or track them


VERDICTS_SCHEMA = "verify-attention/compare-verdicts"
VERDICTS_SCHEMA_VERSION = 1


def _number(x: float | None) -> float | None:
    """A float for JSON: NaN and infinities (which JSON has no words for) as null."""
    return x if x is not None and math.isfinite(x) else None


def _stats_record(s: SampleStats | None) -> dict[str, float | int] | None:
    return None if s is None else asdict(s)


def _fit_record(f: ScalingFit) -> dict[str, Any]:
    """One run's line for a series (:class:`harness.scaling.ScalingFit`), in ms and %."""
    return {
        "prefixes": list(f.prefixes),
        "configs": list(f.configs),
        "fixed_ms": _number(f.fixed_ms),
        "fixed_se_ms": _number(f.fixed_se_ms),
        "fixed_resolved": f.fixed_resolved,
        "ms_per_key": _number(f.ms_per_key),
        "steady_pct_of_floor": _number(f.steady_pct),
        "half_floor_prefix": _number(f.half_floor_prefix) if f.fixed_resolved else None,
        "worst_residual_pct": _number(f.worst_residual_pct),
    }


def _scaling_record(change: FitChange) -> dict[str, Any]:
    return {
        "impl": change.head.impl,
        "mode": change.head.mode,
        "series": change.head.label(),
        "params": dict(change.head.params),
        "fixed_change_ms": _number(change.head.fixed_ms - change.base.fixed_ms),
        "fixed_change_se_ms": _number(change.change_se_ms),
        "base": _fit_record(change.base),
        "head": _fit_record(change.head),
    }


def _side_record(side: Side) -> dict[str, Any]:
    git = side.results.git if isinstance(side.results.git, dict) else {}
    return {
        "label": side.label,
        "revision": side.revision,
        "sha": git.get("sha"),
        "dirty": git.get("dirty"),
        "created_utc": side.results.created_utc,
    }


def verdicts_record(c: Comparison) -> dict[str, Any]:
    """Everything the terminal table and the HTML diff say, as JSON-ready data: both runs, every
    timing and parity verdict with its numbers and reason, and which of them count.

    ``counted`` marks the verdicts that the exit status counts (:meth:`Comparison.is_counted`);
    ``regressions`` is their number."""
    timing = []
    for v in _sorted(c.timing):
        d = v.decision
        timing.append(
            {
                "case_id": v.case_id,
                "impl": v.impl,
                "mode": v.mode,
                "verdict": v.verdict,
                "reason": d.reason,
                "regression": d.regression,
                "gated": c.is_gated(v),
                "waived": c.is_waived(v),
                "counted": c.is_counted(v),
                "throttled": v.throttled,
                "capped": v.capped,
                "change": _number(d.change),
                "p_value": _number(d.p_value),
                "base": _stats_record(d.base),
                "head": _stats_record(d.head),
            }
        )
    parity = [
        {
            "bundle": v.bundle,
            "impl": v.impl,
            "verdict": v.verdict,
            "reason": v.reason,
            "regression": v.regression,
            "counted": c.is_counted(v),
            "base_status": v.base.status if v.base else None,
            "head_status": v.head.status if v.head else None,
        }
        for v in _sorted(c.parity)
    ]
    key = c.head.key
    return {
        "schema": VERDICTS_SCHEMA,
        "schema_version": VERDICTS_SCHEMA_VERSION,
        "group": {"gpu_model": key.gpu_model, "kind": key.kind, "grid": key.grid},
        "base": _side_record(c.base),
        "head": _side_record(c.head),
        "min_change": c.min_change,
        "gated_impls": list(c.gated_impls) if c.gated_impls is not None else None,
        "counts": c.counts(),
        "regressions": len(c.regressions),
        "parity": parity,
        "timing": timing,
        "scaling": [_scaling_record(f) for f in c.scaling],
        "notes": list(c.notes),
        "environment_diff": [{"field": k, "base": b, "head": h} for k, b, h in c.environment_diff],
        "waiver_notes": list(c.waiver_notes),
    }


def json_name(c: Comparison) -> str:
    return html_name(c).removesuffix(".html") + ".json"


def write_json(c: Comparison, out_dir: Path) -> Path:
    """The verdicts (:func:`verdicts_record`) beside the HTML diff, under the same name."""
    path = Path(out_dir) / json_name(c)
    atomic_write_text(path, json.dumps(verdicts_record(c), indent=1, allow_nan=False) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Waivers


@dataclass(frozen=True)
class Waiver:
    """Accepted SLOWER verdicts of one pair of runs (see the module docstring)."""

    base: str  # revision prefixes (>= 7 hex digits) of the two runs' ``git.sha``
    head: str
    gpu_model: str
    kind: str
    grid: str
    impl: str
    cases: tuple[tuple[str, str], ...]  # (case_id, mode)
    reason: str
    evidence: tuple[str, ...]

    def matches(self, base: Side, head: Side) -> bool:
        def same(prefix: str, side: Side) -> bool:
            sha = side.results.git.get("sha") if isinstance(side.results.git, dict) else None
            dirty = isinstance(side.results.git, dict) and bool(side.results.git.get("dirty"))
            if not sha or dirty:
                return False
            # A run may store 7 digits and the waiver give 40, or the other way round.
            sha = str(sha)
            return sha.startswith(prefix) or (len(sha) >= 7 and prefix.startswith(sha))

        k = head.key
        return (
            same(self.base, base)
            and same(self.head, head)
            and base.key == k
            and (self.gpu_model, self.kind, self.grid) == (k.gpu_model, k.kind, k.grid)
        )


_SHA_PREFIX = re.compile(r"^[0-9a-f]{7,40}$")
_WAIVER_FIELDS = frozenset(f.name for f in fields(Waiver))  # the keys a [[waiver]] table may have


def _waiver_text(entry: dict[str, Any], where: str, field: str) -> str:
    v = entry.get(field)
    if not isinstance(v, str) or not v.strip():
        raise CompareError(f"{where}: '{field}' must be a non-empty string, got {v!r}")
    return v.strip()


def load_waivers(path: Path) -> list[Waiver]:
    """The ``[[waiver]]`` entries of a TOML file; CompareError naming the entry and field when one
    is malformed."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise CompareError(f"waivers {path}: cannot read it as TOML: {e}") from e
    unknown = set(data) - {"waiver"}
    if unknown:
        raise CompareError(
            f"waivers {path}: unknown top-level keys {sorted(unknown)}; expected [[waiver]] tables"
        )
    entries = data.get("waiver", [])
    if not isinstance(entries, list):
        raise CompareError(f"waivers {path}: 'waiver' must be an array of tables ([[waiver]])")
    out = []
    for i, e in enumerate(entries):
        where = f"waivers {path}: waiver {i + 1}"
        if not isinstance(e, dict):
            raise CompareError(f"{where}: expected a table of fields, got {e!r}")
        if set(e) - _WAIVER_FIELDS:
            raise CompareError(
                f"{where}: unknown keys {sorted(set(e) - _WAIVER_FIELDS)}; expected {sorted(_WAIVER_FIELDS)}"
            )
        base, head = _waiver_text(e, where, "base"), _waiver_text(e, where, "head")
        for field, v in (("base", base), ("head", head)):
            if not _SHA_PREFIX.match(v):
                raise CompareError(
                    f"{where}: '{field}' must be 7-40 lowercase hex digits of a commit, got {v!r}"
                )
        cases = e.get("cases")
        if not isinstance(cases, list) or not cases:
            raise CompareError(f"{where}: 'cases' must be a non-empty list of 'CASE_ID MODE' strings")
        pairs = []
        for c in cases:
            parts = c.split() if isinstance(c, str) else []
            if len(parts) != 2:
                raise CompareError(f"{where}: each of 'cases' must read 'CASE_ID MODE', got {c!r}")
            pairs.append((parts[0], parts[1]))
        evidence = e.get("evidence")
        if (
            not isinstance(evidence, list)
            or not evidence
            or not all(isinstance(x, str) and x for x in evidence)
        ):
            raise CompareError(f"{where}: 'evidence' must be a non-empty list of strings (reports, notes)")
        out.append(
            Waiver(
                base,
                head,
                _waiver_text(e, where, "gpu_model"),
                _waiver_text(e, where, "kind"),
                _waiver_text(e, where, "grid"),
                _waiver_text(e, where, "impl"),
                tuple(pairs),
                _waiver_text(e, where, "reason"),
                tuple(evidence),
            )
        )
    return out


def apply_waivers(c: Comparison, waivers: Sequence[Waiver]) -> Comparison:
    """``c`` with the SLOWER verdicts that a matching waiver names marked waived, and in its
    ``waiver_notes`` each waiver used (with its reason and evidence) and each entry that waived
    nothing."""
    lines: list[str] = []
    waived: set[tuple[str, str, str]] = set()
    slower = {(v.case_id, v.impl, v.mode) for v in c.timing if v.verdict == SLOWER}
    for w in waivers:
        if not w.matches(c.base, c.head):
            continue
        used = [(case, w.impl, mode) for case, mode in w.cases if (case, w.impl, mode) in slower]
        unused = [f"{case} {mode}" for case, mode in w.cases if (case, w.impl, mode) not in slower]
        waived.update(used)
        if used:
            lines.append(f"waived {len(used)} SLOWER ({w.impl}, {w.base} -> {w.head}): {w.reason}")
            lines.append("  evidence: " + "; ".join(w.evidence))
        if unused:
            lines.append(
                f"waiver {w.base} -> {w.head} names cases that are not SLOWER here: {', '.join(unused)}"
            )
    return replace(c, waived=tuple(sorted(waived)), waiver_notes=tuple(lines))


# ---------------------------------------------------------------------------------------------
# CLI


def _same_committed_run(a: Side, b: Side) -> bool:
    """Both revisions hold the same newest run of a group: no new run to judge."""
    return a.revision is not None and b.revision is not None and a.results.to_json() == b.results.to_json()


def _report(
    pairs: Sequence[tuple[Side | None, Side]], args: argparse.Namespace, waivers: Sequence[Waiver] = ()
) -> int:
    regressions = 0
    for base, head in pairs:
        if base is None:  # a group's only run (--history): its own parity failures count
            c = compare_results(nothing_before(head), head, impls=args.impls, gated_impls=args.gate_impls)
            if not c.regressions:
                print(f"{head.key}: one run ({head.label}); no parity row of it fails\n")
                continue
            base = c.base
            print(f"{head.key}: one run ({head.label}); judged alone, its failing parity rows count\n")
        elif _same_committed_run(base, head):
            print(f"{head.key}: BASE and HEAD are the same run ({head.label}); nothing new to compare\n")
            continue
        c = compare_results(
            base, head, min_change=args.min_change, impls=args.impls, gated_impls=args.gate_impls
        )
        c = apply_waivers(c, waivers)
        vacuous = not matched(c) and not c.regressions
        if vacuous and args.history is None:
            raise CompareError(
                f"{base.label} and {head.label} have no case or parity row in common"
                + (f" among --impls {','.join(args.impls)}" if args.impls else "")
                + "".join(f" ({note})" for note in c.notes if note.startswith("timings are compared only"))
                + ": the comparison would vouch for nothing"
            )
        print(format_terminal(c))
        if vacuous:
            print(f"{head.key}: no case or parity row in common with {base.label}: nothing compared\n")
        for label, write, name in (("html", write_html, html_name), ("json", write_json, json_name)):
            try:
                print(f"{label}: {write(c, args.out)}")
            except OSError as e:  # exit 1 says "regressions": a file that cannot be written is not one
                raise CompareError(
                    f"--out {args.out}: cannot write {name(c)} there ({e.strerror or e}); "
                    "expected a writable folder"
                ) from e
        print()
        regressions += len(c.regressions)
    if regressions:
        print(f"compare: {regressions} regression(s)", file=sys.stderr)
    return 1 if regressions else 0


def matched(c: Comparison) -> int:
    """How many parity rows and timed cases the two runs of ``c`` both have."""
    one_side = (BASE_ONLY, HEAD_ONLY, NO_DATA)
    return sum(v.base is not None and v.head is not None for v in c.parity) + sum(
        v.verdict not in one_side for v in c.timing
    )


def check_impl_names(pairs: Sequence[tuple[Side | None, Side]], args: argparse.Namespace) -> None:
    """CompareError when a name of ``--impls`` or a pattern of ``--gate-impls`` matches no
    implementation of the runs compared: a typo there would compare or gate nothing, silently."""
    found = {
        r.impl
        for pair in pairs
        for side in pair
        if side is not None
        for r in (*side.results.parity, *side.results.sweep)
    }
    known = ", ".join(sorted(found)) or "none"
    for option, names, hit in (
        ("--impls", args.impls, lambda n: n in found),
        ("--gate-impls", args.gate_impls, lambda g: any(fnmatch.fnmatchcase(i, g) for i in found)),
    ):
        missing = [n for n in names or () if not hit(n)]
        if missing:
            raise CompareError(
                f"{option} {','.join(missing)}: matches no implementation of the runs compared "
                f"(they have: {known})"
            )


def run(args: argparse.Namespace) -> int:
    try:
        check_out_dir(args.out)
    except ValueError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    try:
        if args.history is not None:
            if not str(args.history):
                raise CompareError(
                    "--history is empty; expected the reports folder (an empty path would mean the current folder)"
                )
            if args.base or args.head:
                raise CompareError("--history takes no BASE/HEAD arguments; give one or the other")
            history = Path(args.history)
            if history.is_dir() and not results_files_under(history):  # a wrong folder: no pass
                raise CompareError(
                    f"--history {args.history}: no results.json (or results.json.gz) found there; "
                    "expected the reports folder"
                )
            pairs = history_groups(Path(args.history))
            if args.waivers is None and (Path(args.history) / WAIVERS_FILE).is_file():
                args.waivers = Path(args.history) / WAIVERS_FILE
            if not any(base is not None for base, _ in pairs):
                print(
                    f"compare --history {args.history}: no GPU model, kind and grid has two runs; "
                    "each run's parity is judged alone, nothing to compare"
                    + untracked_note(Path(args.history))
                )
        else:
            if not (args.base and args.head):
                raise CompareError(
                    "expected BASE and HEAD (results.json, report folder or git revision), or --history DIR"
                )
            pairs = resolve_pairs(args.base, args.head)
            for base, head in pairs:
                check_comparable(base, head, force=args.force)
        check_impl_names(pairs, args)
        waivers = load_waivers(args.waivers) if args.waivers is not None else []
        return _report(pairs, args, waivers)
    except (CompareError, ResultsError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2


# ``--out``: a folder for the HTML diff and its verdicts file; an empty value is refused.
out_folder = nonempty_path("a folder for the HTML diff and its verdicts file")


def parse_min_change(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"--min-change must be a fraction in (0, 1) such as 0.03, got {text!r}"
        )
    return value


def _impl_list(option: str) -> Callable[[str], list[str]]:
    """The parser of ``option``'s comma-separated implementation names (its errors name it)."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(
                f"{option} must list implementation names (or patterns) separated by commas, got {text!r}"
            )
        return names

    return parse


def register_cli(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="verdicts per case between two runs; exit 1 on SLOWER or a parity regression",
        description=__doc__.split("\n\n", 1)[0],
    )
    p.add_argument("base", nargs="?", help="BASE: a results.json, a report folder or a git revision")
    p.add_argument("head", nargs="?", help="HEAD: a results.json, a report folder or a git revision")
    p.add_argument("--history", metavar="DIR", help="compare the newest two runs of every group under DIR")
    p.add_argument("--force", action="store_true", help="compare runs of different GPU models or kinds")
    p.add_argument(
        "--out",
        type=out_folder,
        default=DEFAULT_OUT,
        help=f"folder for the HTML diff and its verdicts as JSON (default {DEFAULT_OUT})",
    )
    p.add_argument(
        "--min-change",
        type=parse_min_change,
        default=DEFAULT_MIN_CHANGE,
        help=f"minimum median change counted as SLOWER/FASTER (default {DEFAULT_MIN_CHANGE})",
    )
    p.add_argument(
        "--impls", type=_impl_list("--impls"), default=None, help="only these implementations (a,b)"
    )
    p.add_argument(
        "--gate-impls",
        type=_impl_list("--gate-impls"),
        default=None,
        help="count timing regressions only for these implementations (a,b; shell patterns such as "
        "'verify-attn-cuda*' match names); all verdicts still shown",
    )
    p.add_argument(
        "--waivers",
        type=Path,
        default=None,
        help=f"TOML file of accepted SLOWER verdicts (default with --history: DIR/{WAIVERS_FILE} if present)",
    )
    p.set_defaults(func=run)
