"""Timing one implementation on one case: how a sample is taken and how many are taken.

Method (DESIGN.md section 5)
----------------------------
* Clock. On a CUDA device every sample is one call bracketed by two ``torch.cuda.Event``
  records on the current stream; the sample is the event-to-event time. On the CPU (used only
  to test the sweep's plumbing) the clock is ``time.perf_counter``, which is exact there
  because CPU ops finish before they return.
* Warm-up. ``warmup`` untimed calls first (JIT builds, Triton autotuning, lazy allocations,
  clocks ramping up), then a pilot of three samples estimates the time per call.
* Device time, not launch latency. Before each sample a spin kernel (``torch.cuda._sleep``),
  sized from the host time of a call measured during warm-up (twice it, plus a margin:
  :func:`spin_ms`), keeps the GPU busy while the host enqueues the sample, so the events
  bracket device work and never an idle GPU waiting for Python. Host work inside a call that
  synchronises (which a graph capture would reject) is still counted.
* Cold L2 (the default). Before every sample and outside the events, either
  - flush: zero a buffer of 2x the L2 size (``L2_cache_size`` of the device: 60 MiB
    on an H200, so 126 MB) and then read it back. Writing evicts everything; reading back leaves
    clean lines, so the timed call neither finds its data in L2 nor pays the write-back of
    the flush; or
  - rotate: cycle through several prepared input sets (``rotate``), so that between two uses
    of one set the others have touched more than 2x L2. The sweep rotates while all sets
    together stay under ~5x L2 (:func:`rotation_sets`) and flushes above that.
* Graph mode. The call is captured once in a ``torch.cuda.CUDAGraph`` (after warm-up on a
  side stream, as capture requires) and each sample times one replay, with the same cold-L2
  handling. It is the launch-overhead-free column of the report and proves the call is
  capturable.
* How many samples. At least ``min_samples`` (a median and quartiles that mean something),
  then more in chunks until the 95 % confidence interval of the median is within ``rel_ci``
  of it, ``max_samples`` is reached, or the samples would exceed ``max_time_s`` of device
  time. A slow implementation (tens of milliseconds per call) thus gets fewer samples than
  ``min_samples``, never fewer than three, and the timing's ``note`` says so.
* Statistics. Median, quartiles (linear interpolation, as ``numpy.percentile``), IQR, min and
  max of the raw samples, which are all kept.
* Throttling per sample (given a ``monitor``, :class:`harness.nvml.Poller`). Once a batch of
  samples is enqueued the host, instead of blocking until the GPU is done, reads NVML again and
  again, with half a millisecond's sleep after each reading (a reading itself took ~1.6 ms on
  an H100), until the batch's last event has run; one reading is taken before the first batch
  and one after each (which opens the next). Each sample's span is placed on the host's
  monotonic clock from an event recorded on the idle GPU as the batch starts and waited for,
  between two reads of that clock (``Timing.spans``: from the first read for its start, the
  second for its end), so
  :func:`harness.nvml.flag_samples` can name the samples whose nearest readings show a cap.
  Nothing is added between a sample's two events, and the host reads NVML only while the GPU
  already holds every sample of the batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any, Protocol

import torch

from harness.nvml import POLL_INTERVAL_S

MODES = ("cold", "graph")
PILOT_SAMPLES = 3
MIN_SLOW_SAMPLES = 3
CHUNK_SAMPLES = 25
# L2 size assumed where the device does not report one (the H200's, the largest we target).
DEFAULT_L2_BYTES = 60 * 1024 * 1024
# On the CPU (plumbing tests only) a last-level cache of this size is assumed: flushing
# 2x the GPU's L2 there would make every sample cost tens of milliseconds.
CPU_CACHE_BYTES = 16 * 1024 * 1024
FLUSH_FACTOR = 2.0
# All input sets together stay under this many L2s. At 6 (with FLUSH_FACTOR 2) the choice is
# monotonic in the working set: rotate up to 3x L2 (three sets up to 2x, two beyond), flush above.
# At 5 a prefix series went rotate -> flush -> rotate -> flush (1.67-2x L2 flushed, 2-2.5x
# rotated), so rows of one series paid the kernel code's fetch from DRAM on and off.
ROTATE_MAX_FACTOR = 6.0
# The spin's cap: a call that synchronises inside (its host time is then its device time too)
# would otherwise make every sample wait twice that for nothing.
MAX_SPIN_MS = 2.0
# The spin before each sample: twice a call's host time (median of the warm-up calls) plus a
# margin, capped. The GPU must still be busy when the host has enqueued the whole sample (the
# spin's own launch, the flush, two events and the call), and the host's time jitters. Sized to
# one call's host time, samples queued behind each other only while a call outlasted that
# overhead: calls of ~20 us read 5-10 us long in some sweeps and not in others, the kernel the
# same (kernel/NOTES.md, v27), as the first TP runs' short calls did before they had this rule.
SPIN_FACTOR = 2.0
SPIN_MARGIN_MS = 0.02

Call = Callable[[], object]
# One lock per box, beside other processes' temp files, so every checkout on the box shares it.
GPU_LOCK_PATH = Path(tempfile.gettempdir()) / "verify-attention-gpu.lock"


@dataclass(frozen=True)
class Stats:
    n: int
    median_ms: float
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float


@dataclass(frozen=True)
class Timing:
    mode: str  # "cold" | "graph"
    samples_ms: list[float]
    stats: Stats
    cold_l2: str  # how L2 was made cold: "flush 126 MB", "rotate 7 input sets", "none (cpu)"
    note: str  # "" or why there are fewer samples than asked for
    # Each sample's (start, end) on the host's time.monotonic() clock, seconds; None unless
    # measure() was given a monitor on a CUDA device
    spans: list[tuple[float, float]] | None = None

    @property
    def median_ms(self) -> float:
        return self.stats.median_ms


def quantile(sorted_samples: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted samples, linear interpolation between ranks."""
    if not sorted_samples:
        raise ValueError("quantile: expected at least one sample, got none")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q must be in [0, 1], got {q}")
    pos = q * (len(sorted_samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float]) -> Stats:
    """Median, quartiles, IQR, min and max of raw samples (milliseconds)."""
    if not samples_ms:
        raise ValueError("summarize: samples_ms is empty; a timing needs at least one sample")
    s = sorted(float(x) for x in samples_ms)
    q1, q3 = quantile(s, 0.25), quantile(s, 0.75)
    return Stats(
        n=len(s),
        median_ms=statistics.median(s),
        q1_ms=q1,
        q3_ms=q3,
        iqr_ms=q3 - q1,
        min_ms=s[0],
        max_ms=s[-1],
    )


def median_ci(samples_ms: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    The number of samples below the median is Binomial(n, 1/2); its normal approximation gives
    the ranks ``n/2 -+ z*sqrt(n)/2``. Below 6 samples no such interval exists and the range
    (min, max) is returned.
    """
    s = sorted(samples_ms)
    n = len(s)
    if n == 0:
        raise ValueError("median_ci: samples_ms is empty")
    if n < 6:
        return s[0], s[-1]
    half = z * math.sqrt(n) / 2.0
    lo = max(math.floor(n / 2.0 - half), 0)
    hi = n - 1 - lo  # the same rank from the top (0-based: the median sits at (n - 1) / 2)
    return s[lo], s[hi]


def is_stable(samples_ms: Sequence[float], rel_ci: float) -> bool:
    """True when the median's 95 % interval lies within +-rel_ci of the median."""
    lo, hi = median_ci(samples_ms)
    med = statistics.median(samples_ms)
    return med > 0 and max(med - lo, hi - med) <= rel_ci * med


def sample_budget(est_ms: float, *, min_samples: int, max_samples: int, max_time_s: float) -> tuple[int, str]:
    """How many samples fit in ``max_time_s`` at ``est_ms`` per call, and a note when too few.

    Returns (n, note): n is in [min(3, max_samples), max_samples]; note is "" unless n is below
    ``min_samples`` because the implementation is slow.
    """
    if est_ms <= 0 or not math.isfinite(est_ms):
        raise ValueError(f"sample_budget: est_ms must be a positive time, got {est_ms}")
    fit = math.floor(max_time_s * 1000.0 / est_ms)
    n = max(min(fit, max_samples), min(MIN_SLOW_SAMPLES, max_samples))
    if n >= min_samples:
        return n, ""
    return n, (
        f"fewer samples ({n} < {min_samples}): slow implementation, ~{est_ms:.3g} ms per call "
        f"within the {max_time_s:g} s budget per case"
    )


def rotation_sets(working_set_bytes: int, l2_bytes: int) -> int:
    """Input sets to rotate for a cold L2, or 0 when flushing is the way (sets would not fit).

    Between two uses of one set the other ``n - 1`` sets must touch at least 2x L2; all ``n``
    sets together must stay under 6x L2 of device memory, so a working set up to 3x L2 rotates
    and a larger one flushes (monotonic in its size).
    """
    if working_set_bytes <= 0:
        raise ValueError(f"rotation_sets: working_set_bytes must be positive, got {working_set_bytes}")
    n = math.ceil(FLUSH_FACTOR * l2_bytes / working_set_bytes) + 1
    return n if n * working_set_bytes <= ROTATE_MAX_FACTOR * l2_bytes else 0


def round_sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (keeps results.json small)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def l2_bytes_of(device: torch.device) -> int:
    """The device's L2 size in bytes (from its properties when torch exposes them)."""
    if device.type != "cuda":
        return CPU_CACHE_BYTES
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    return int(size) if size else DEFAULT_L2_BYTES


class L2Flush:
    """A call that evicts the cache: zero ``nbytes`` on ``device``, then read them back.

    Writing evicts everything; reading back leaves clean lines, so the next timed call neither
    finds its data in L2 nor pays the write-back of the flush. Enqueued asynchronously.
    """

    def __init__(self, device: torch.device | str, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"L2Flush: nbytes must be positive, got {nbytes}")
        self.buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()
        torch.sum(self.buf, dim=0, out=self.sink)


class Monitor(Protocol):
    """What the sampler reads while samples run (:class:`harness.nvml.Poller`)."""

    def read(self) -> None: ...


class Sampler:
    """Takes samples of a list of calls (one per input set), cycling through them. With a
    ``monitor`` on a CUDA device it also reads the monitor while each batch runs and keeps each
    sample's host-time span in ``spans`` (the module docstring, "Throttling per sample")."""

    def __init__(
        self, calls: list[Call], device: torch.device, flush_bytes: int, monitor: Monitor | None = None
    ) -> None:
        self.calls = calls
        self.device = device
        self.next = 0
        self.spin_cycles = 0
        self.flush = L2Flush(device, flush_bytes) if flush_bytes > 0 else None
        self.monitor = monitor if device.type == "cuda" else None
        self.spans: list[tuple[float, float]] = []
        # the monitor's last reading closed the previous batch: it opens the next one too
        self._read_since_batch = False

    def _flush(self) -> None:
        if self.flush is not None:
            self.flush()

    def _call(self) -> Call:
        call = self.calls[self.next % len(self.calls)]
        self.next += 1
        return call

    def untimed(self) -> float:
        """One call without timing; returns its host time in ms (the enqueue cost on a GPU)."""
        self._flush()
        t0 = time.perf_counter()
        self._call()()
        return (time.perf_counter() - t0) * 1000.0

    def samples(self, count: int) -> list[float]:
        if self.device.type != "cuda":
            out = []
            for _ in range(count):
                self._flush()
                call = self._call()
                t0 = time.perf_counter()
                call()
                out.append((time.perf_counter() - t0) * 1000.0)
            return out
        monitor = self.monitor
        if monitor is not None:
            # The GPU is idle here (every batch ends in a synchronisation, and so does the
            # warm-up), so the anchor runs between t0 and t1: a sample's span on the host's clock
            # is taken from t0 for its start and from t1 for its end, which holds it whole.
            if not self._read_since_batch:
                monitor.read()
            anchor = torch.cuda.Event(enable_timing=True)
            t0 = time.monotonic()
            anchor.record()
            anchor.synchronize()
            t1 = time.monotonic()
        events = []
        for _ in range(count):
            if self.spin_cycles:
                torch.cuda._sleep(self.spin_cycles)
            self._flush()
            call = self._call()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            events.append((start, end))
        if monitor is not None:
            last = events[-1][1] if events else anchor
            while not last.query():
                monitor.read()
                time.sleep(POLL_INTERVAL_S)
        torch.cuda.synchronize(self.device)
        if monitor is not None:
            monitor.read()
            self._read_since_batch = True
            self.spans += [
                (t0 + anchor.elapsed_time(s) / 1e3, t1 + anchor.elapsed_time(e) / 1e3) for s, e in events
            ]
        return [s.elapsed_time(e) for s, e in events]


class EventClock:
    """A clock for pytest-benchmark that reads GPU time: its calls alternate start and stop. A
    start records a CUDA event on the current stream and returns the time so far; a stop records
    another, waits for it and adds the GPU time between the two, so that ``stop - start`` is the
    time the GPU took for what was enqueued between the calls, as the sweep's events read it (a
    host clock would add the launch and the synchronisation). Used as
    ``@pytest.mark.benchmark(timer=EventClock())``; the caller enqueues the spin and the flush
    before each start (tests/test_benchmarks.py)."""

    __name__ = "EventClock"  # how pytest-benchmark names the timer in what it stores

    def __init__(self) -> None:
        self.total_s = 0.0
        self._start: Any = None

    def reset(self) -> None:
        """Forget a start whose stop never came (a target that raised): the next call starts."""
        self._start = None

    def __call__(self) -> float:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if self._start is None:
            self._start = event
            return self.total_s
        event.synchronize()
        self.total_s += self._start.elapsed_time(event) / 1000.0
        self._start = None
        return self.total_s


def spin_ms(host_ms: Sequence[float]) -> float:
    """The spin before each sample, from the warm-up calls' host times (ms)."""
    return min(SPIN_FACTOR * statistics.median(host_ms) + SPIN_MARGIN_MS, MAX_SPIN_MS)


@cache
def spin_cycles_per_ms(device_index: int) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on this device (calibrated once)."""
    with torch.cuda.device(device_index):
        torch.cuda._sleep(1_000_000)  # first use loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / start.elapsed_time(end)


def capture_graph(fn: Call, device: torch.device, warmup: int) -> Call:
    """``fn`` captured in a CUDA graph; returns a call that replays it."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure(
    run_fn: Call,
    *,
    mode: str = "cold",
    warmup: int = 5,
    min_samples: int = 20,
    max_samples: int = 200,
    max_time_s: float = 2.0,
    rel_ci: float = 0.01,
    l2_bytes: int | None = None,
    rotate: Sequence[Call] | None = None,
    device: torch.device | str = "cuda",
    monitor: Monitor | None = None,
) -> Timing:
    """Time ``run_fn`` as the module docstring describes and return the raw samples and stats.

    ``rotate``: further calls of the same operation on other input sets; when given, samples
    cycle through ``[run_fn, *rotate]`` and L2 is not flushed. ``l2_bytes`` overrides the
    device's L2 size for the flush. ``monitor`` (CUDA only): read while the samples run, and
    each sample's host-time span kept in ``Timing.spans``.
    """
    device = torch.device(device)
    if mode not in MODES:
        raise ValueError(f"measure: mode must be one of {MODES}, got {mode!r}")
    if mode == "graph" and device.type != "cuda":
        raise ValueError(f"measure: mode 'graph' needs a CUDA device, got {device}")
    if not 1 <= min_samples <= max_samples:
        raise ValueError(
            f"measure: need 1 <= min_samples <= max_samples, got min_samples={min_samples}, "
            f"max_samples={max_samples}"
        )
    if max_time_s <= 0:
        raise ValueError(f"measure: max_time_s must be positive, got {max_time_s}")
    # Events, the spin and graph capture use the current device's stream: make it ``device``
    # (a "cuda:1" call from a process whose current device is 0 would otherwise time device 0).
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        return _measure(
            run_fn,
            mode,
            warmup,
            min_samples,
            max_samples,
            max_time_s,
            rel_ci,
            l2_bytes,
            rotate,
            device,
            monitor,
        )


def _measure(
    run_fn: Call,
    mode: str,
    warmup: int,
    min_samples: int,
    max_samples: int,
    max_time_s: float,
    rel_ci: float,
    l2_bytes: int | None,
    rotate: Sequence[Call] | None,
    device: torch.device,
    monitor: Monitor | None = None,
) -> Timing:
    calls = [run_fn, *(rotate or [])]
    if rotate:
        flush_bytes = 0
        cold_l2 = f"rotate {len(calls)} input sets"
    else:
        flush_bytes = int(FLUSH_FACTOR * (l2_bytes or l2_bytes_of(device)))
        cold_l2 = f"flush {flush_bytes / 1e6:.0f} MB" + ("" if device.type == "cuda" else " (host cache)")
    if mode == "graph":
        calls = [capture_graph(c, device, warmup) for c in calls]
    sampler = Sampler(calls, device, flush_bytes, monitor)

    # every input set is touched at least once before timing (first-use allocations)
    host_ms = [sampler.untimed() for _ in range(max(warmup, len(calls), 1))]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        sampler.spin_cycles = int(spin_ms(host_ms) * spin_cycles_per_ms(index))

    samples = sampler.samples(min(PILOT_SAMPLES, max_samples))
    # a call below the clock's resolution reads as 0 ms: it is fast, not free
    est_ms = max(statistics.median(samples), 1e-6)
    budget, note = sample_budget(
        est_ms, min_samples=min_samples, max_samples=max_samples, max_time_s=max_time_s
    )
    while len(samples) < budget:
        if len(samples) >= min_samples and is_stable(samples, rel_ci):
            break
        want = min_samples - len(samples) if len(samples) < min_samples else CHUNK_SAMPLES
        samples += sampler.samples(min(want, budget - len(samples)))
    return Timing(
        mode=mode,
        samples_ms=samples,
        stats=summarize(samples),
        cold_l2=cold_l2,
        note=note,
        spans=sampler.spans if sampler.monitor is not None else None,
    )


class GpuLockError(RuntimeError):
    """The GPU lock file cannot be opened; the message names it and what to do."""


def _open_lock(path: Path) -> tuple[IO[str], bool]:
    """(file, writable): the lock file, created if missing, opened for writing where this user
    may and read-only otherwise.

    The file is created with mode 0o666 so that other users' runs can open it too; the umask
    narrows that (0o644 under the usual 022), and a file left so by another user is opened
    read-only: ``flock`` needs no write access, so the runs still exclude each other, only the
    holder's pid is not written for a waiting run to show.
    """
    try:
        return open(os.open(path, os.O_RDWR | os.O_CREAT, 0o666), "r+", encoding="utf-8"), True
    except PermissionError as e:
        error: OSError = e
        with contextlib.suppress(OSError):  # else the first error is the one to show
            return open(os.open(path, os.O_RDONLY), encoding="utf-8"), False
    except OSError as e:
        error = e
    raise GpuLockError(
        f"cannot open the GPU lock file {path}: {error.strerror or error}. Remove it if no run is "
        "using it, or give every user read access to it; or set TMPDIR to a folder you can write, "
        "which moves the lock there (runs with another TMPDIR then do not wait for this one)"
    ) from error


def gpu_lock_for(device: torch.device) -> contextlib.AbstractContextManager:
    """:func:`exclusive_gpu` for a run on a CUDA device; a CPU run neither waits for the lock nor
    holds one up."""
    return exclusive_gpu() if device.type == "cuda" else contextlib.nullcontext()


@contextlib.contextmanager
def exclusive_gpu(path: Path = GPU_LOCK_PATH) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` while timing: two timed runs on one box
    would share the GPU and slow each other down. Waits (saying so) while another holds it.
    Raises GpuLockError, naming ``path``, when the lock file cannot be opened."""
    f, writable = _open_lock(path)
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            print(f"waiting for the GPU lock {path} held by {holder}", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        if writable:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}\n")
            f.flush()
        try:
            yield
        finally:
            if writable:
                f.seek(0)
                f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)
