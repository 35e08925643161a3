"""GPU state from NVML (nvidia-ml-py, imported as ``pynvml``): clocks, temperature, power, throttling.

A sweep takes a :func:`snapshot` before and after each case; a case whose snapshot shows a
throttle reason other than idle / application clocks / none, or whose violation time grew
between the two, is flagged as throttled, since its samples may have run below the clocks of
the others. Where the samples are also read one by one (below), the row says how many were.

    snap, reason = snapshot(torch.device("cuda:0"))
    snap  -> {"name", "uuid", "driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz",
              "max_mem_clock_mhz", "temperature_c", "power_w", "power_limit_w",
              "throttle_reasons": [...], "throttled": bool}   or None (then reason says why)

Per sample, a :class:`Poller` reads the clock-event reasons and the violation counters while the
samples run (:func:`harness.timing.measure` reads it between the samples' enqueue and their end),
and :func:`flag_samples` names the samples whose nearest readings show a cap:

    poller, reason = Poller.of(torch.device("cuda:0"))       # None where NVML cannot be read
    t = measure(fn, monitor=poller)                           # t.spans: each sample's host time
    flagged = flag_samples(t.spans, poller.readings)          # indices into t.samples_ms
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

# NVML's clock event ("throttle") reason bits, from nvml.h; stable across driver versions.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that do not lower the clocks a kernel runs at: idle between cases, or clocks pinned
# on purpose by the administrator.
BENIGN_REASONS = frozenset({"none", "gpu_idle", "applications_clocks_setting"})


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clock-event bit mask; ``["none"]`` for 0."""
    if mask < 0:
        raise ValueError(f"decode_throttle_reasons: mask must be a non-negative bit mask, got {mask}")
    if mask == 0:
        return ["none"]
    names = [name for bit, name in THROTTLE_REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASON_BITS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


def is_throttled(reasons: list[str]) -> bool:
    """True when any reason may have lowered the clocks (see ``BENIGN_REASONS``)."""
    return any(r not in BENIGN_REASONS for r in reasons)


def _text(value: bytes | str) -> str:
    # older nvidia-ml-py returns bytes, newer returns str
    return value.decode() if isinstance(value, bytes) else value


def _handle(pynvml: Any, device: torch.device) -> Any:
    """The NVML handle of a CUDA device, matched by UUID (CUDA and NVML orders can differ)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _reasons_reader(pynvml: Any) -> Any:
    # renamed in NVML 12.2; older bindings only have the throttle name
    return (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )


def _violation_ns(pynvml: Any, handle: Any, policy_name: str) -> int | None:
    """Cumulative time NVML's policy ``policy_name`` held the clocks down since the driver
    loaded; None where the board or the bindings do not say. Two readings bracket a span of
    time, where the current reasons show only its two ends."""
    policy = getattr(pynvml, policy_name, None)
    read = getattr(pynvml, "nvmlDeviceGetViolationStatus", None)
    if policy is None or read is None:
        return None
    try:
        value = getattr(read(handle, policy), "violationTime", None)
    except pynvml.NVMLError:
        return None
    return int(value) if isinstance(value, int) else None


def _read(pynvml: Any, handle: Any) -> dict[str, Any]:
    def get(fn: Any, *args: Any) -> Any:
        # a field the board does not support is None; the other fields still count
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    def watts(milliwatts: int | None) -> float | None:
        return None if milliwatts is None else round(milliwatts / 1000.0, 1)

    reasons = decode_throttle_reasons(int(_reasons_reader(pynvml)(handle)))

    return {
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
        "sm_clock_mhz": get(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "mem_clock_mhz": get(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": get(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": get(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "temperature_c": get(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        "power_w": watts(get(pynvml.nvmlDeviceGetPowerUsage, handle)),
        "power_limit_w": watts(get(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        "throttle_reasons": reasons,
        "throttled": is_throttled(reasons),
        "violation_ns": {
            "power": _violation_ns(pynvml, handle, "NVML_PERF_POLICY_POWER"),
            "thermal": _violation_ns(pynvml, handle, "NVML_PERF_POLICY_THERMAL"),
        },
    }


@cache
def _nvml() -> tuple[Any, str]:
    """The initialised pynvml module, or (None, reason). Initialised once per process: NVML's
    start-up can take a tenth of a second, too much for two snapshots per case."""
    try:
        import pynvml
    except ImportError as e:
        return None, f"nvidia-ml-py is not installed ({e})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return None, f"NVML could not start: {e}"
    return pynvml, ""


def _device_handle(device: torch.device | str) -> tuple[Any, Any, str]:
    """(pynvml, handle, "") of a CUDA device, or (None, None, reason) when NVML cannot be read here."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, None, f"NVML describes CUDA devices; this run is on {device}"
    if not torch.cuda.is_available():
        return None, None, "no CUDA device is visible to torch"
    pynvml, reason = _nvml()
    if pynvml is None:
        return None, None, reason
    try:
        return pynvml, _handle(pynvml, device), ""
    except Exception as e:  # NVML is context for a run, never a reason to stop it
        return None, None, f"NVML query failed: {type(e).__name__}: {e}"


def snapshot(device: torch.device | str = "cuda") -> tuple[dict[str, Any] | None, str]:
    """(state, "") of a CUDA device, or (None, reason) when NVML cannot be read here."""
    pynvml, handle, reason = _device_handle(device)
    if pynvml is None:
        return None, reason
    try:
        return _read(pynvml, handle), ""
    except Exception as e:  # NVML is context for a run, never a reason to stop it
        return None, f"NVML query failed: {type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------------
# Per sample

# How long the host sleeps between two readings while a batch of samples runs. A reading of three
# NVML queries took 1.6 ms on an H100, whose power violation time moved at every reading (the SM
# clock, a fourth query since, was not timed apart): the reading's own cost bounds what a flag
# resolves (README, "Choices made where the design was silent").
POLL_INTERVAL_S = 0.0005
# Each sample's host-time span is widened by this much on both sides before its nearest readings
# are taken: the span is placed from an event the GPU runs a few microseconds after the host
# reads its clock (harness/timing.py, Sampler.samples).
SPAN_MARGIN_S = 0.00005
# A cap flags a sample only where NVML's SM clock in the sample's window reads below this share
# of the board's maximum. NVML keeps a cap reason set, and its power violation time growing, for
# hundreds of milliseconds after the clock is back within 1 % of its maximum (an H100 at its
# 700 W cap; kernel/NOTES.md, "Measured next: the SM clock a kernel gets after a load"), and a
# sample at 98 % of the clock is at most ~2 % slower, under the history gate's 3 %.
CLOCK_LOWERED_BELOW = 0.98
_BENIGN_MASK = sum(bit for bit, name in THROTTLE_REASON_BITS.items() if name in BENIGN_REASONS)


@dataclass(frozen=True)
class Reading:
    """One NVML reading of a GPU: the host's ``time.monotonic()`` before its first query and
    after its last (a reading's values were observed somewhere between the two), the
    clock-event reason bits, the cumulative power and thermal violation times (ns), and the SM
    clock (MHz; each None where the board does not say)."""

    t: float
    t_end: float
    reasons: int
    power_ns: int | None
    thermal_ns: int | None
    sm_mhz: int | None = None

    @property
    def capped(self) -> bool:
        """A reason that may lower the clocks is set (see ``BENIGN_REASONS``)."""
        return bool(self.reasons & ~_BENIGN_MASK)


class Poller:
    """Reads one GPU's clock-event reasons, violation counters and SM clock on each
    :meth:`read`, with the host's monotonic time, into ``readings`` (:meth:`clear` empties it):
    four NVML queries, none of a snapshot's other fields, read while samples run.
    ``max_sm_mhz`` is the board's maximum SM clock (None where NVML does not say).
    A query that fails ends the readings (``failed`` says why); the samples are then not flagged."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._pynvml = pynvml
        self._handle = handle
        self._get_reasons = _reasons_reader(pynvml)
        self.max_sm_mhz = _clock_mhz(pynvml, handle, "nvmlDeviceGetMaxClockInfo")
        self.readings: list[Reading] = []
        self.failed = ""

    @classmethod
    def of(cls, device: Any) -> tuple[Poller | None, str]:
        """A poller of a CUDA device, or (None, reason) where NVML cannot be read here."""
        pynvml, handle, reason = _device_handle(device)
        return (None, reason) if pynvml is None else (cls(pynvml, handle), "")

    def clear(self) -> None:
        self.readings = []
        self.failed = ""

    def read(self) -> None:
        if self.failed:
            return
        p, h = self._pynvml, self._handle
        t = time.monotonic()
        try:
            reasons = int(self._get_reasons(h))
            power = _violation_ns(p, h, "NVML_PERF_POLICY_POWER")
            thermal = _violation_ns(p, h, "NVML_PERF_POLICY_THERMAL")
            sm = _clock_mhz(p, h, "nvmlDeviceGetClockInfo")
        except Exception as e:  # context for a run, never a reason to stop it
            self.failed = f"NVML query failed: {type(e).__name__}: {e}"
            return
        first = self.readings[0] if self.readings else None
        if first is not None and (
            (first.power_ns is None) != (power is None)
            or (first.thermal_ns is None) != (thermal is None)
            or (first.sm_mhz is None) != (sm is None)
        ):
            # a counter that comes and goes would let a window's edge skip its growth, and a
            # clock that does would let a window miss its lowest reading
            self.failed = (
                "NVML's violation times or SM clock were readable in some readings and not in others"
            )
            return
        self.readings.append(Reading(t, time.monotonic(), reasons, power, thermal, sm))


def _clock_mhz(pynvml: Any, handle: Any, getter: str) -> int | None:
    """The SM clock (MHz) that NVML's ``getter`` (the current or the maximum one) gives; None
    where the board or the bindings do not say."""
    read, which = getattr(pynvml, getter, None), getattr(pynvml, "NVML_CLOCK_SM", None)
    if read is None or which is None:
        return None
    try:
        value = read(handle, which)
    except pynvml.NVMLError:
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


def _grew(first: int | None, last: int | None) -> bool:
    return isinstance(first, int) and isinstance(last, int) and last > first


def clock_line(readings: Sequence[Reading], max_sm_mhz: int | None) -> float | None:
    """The SM clock (MHz) under which a reading counts as lowered for :func:`flag_samples`:
    ``CLOCK_LOWERED_BELOW`` of the board's maximum; None (a cap alone flags) where the maximum
    or any reading's clock is unknown."""
    if max_sm_mhz is None or any(r.sm_mhz is None for r in readings):
        return None
    return CLOCK_LOWERED_BELOW * max_sm_mhz


def flag_samples(
    spans: Sequence[tuple[float, float]],
    readings: Sequence[Reading],
    margin_s: float = SPAN_MARGIN_S,
    max_sm_mhz: int | None = None,
) -> list[int]:
    """Indices of the samples that may have run capped: those whose readings, from the last one
    finished before the sample's start to the first one begun after its end (its host-time span
    widened by ``margin_s``; the first or last reading where none lies beyond it), include one
    with a clock-lowering reason, or across which the power or thermal violation time grew. A
    reading in flight at either end is inside the window, not its edge: its values may have
    been observed during the sample. Given the board's ``max_sm_mhz`` and readings that carry
    the SM clock, such a window flags its sample only where one of its readings has the clock
    below ``CLOCK_LOWERED_BELOW`` of that maximum: NVML reports a cap for hundreds of
    milliseconds after the clock is back (``CLOCK_LOWERED_BELOW``'s comment).

    ``spans`` are (start, end) in ``time.monotonic()`` seconds, one per sample; ``readings`` in
    the order taken. ValueError without readings, or with readings out of time order."""
    if not readings:
        raise ValueError("flag_samples: readings is empty; a poller that read nothing flags nothing")
    starts, ends = [r.t for r in readings], [r.t_end for r in readings]
    if any(r.t_end < r.t for r in readings) or any(b.t < a.t_end for a, b in itertools.pairwise(readings)):
        raise ValueError("flag_samples: readings must be in the order they were taken, one after another")
    # capped_before[i]: readings[0..i) include a capped one, so a window's test is one subtraction
    capped_before = [0]
    for r in readings:
        capped_before.append(capped_before[-1] + r.capped)
    # lowered_before[i]: readings[0..i) with the SM clock below the line; no line where the
    # maximum or any reading's clock is unknown (the cap alone then flags, as it always did)
    line = clock_line(readings, max_sm_mhz)
    lowered_before = [0]
    for r in readings:
        lowered_before.append(lowered_before[-1] + (line is not None and r.sm_mhz < line))
    flagged = []
    for i, (start, end) in enumerate(spans):
        lo = max(bisect.bisect_right(ends, start - margin_s) - 1, 0)
        hi = min(bisect.bisect_left(starts, end + margin_s), len(readings) - 1)
        first, last = readings[lo], readings[hi]
        capped = (
            capped_before[hi + 1] > capped_before[lo]
            or _grew(first.power_ns, last.power_ns)
            or _grew(first.thermal_ns, last.thermal_ns)
        )
        if capped and (line is None or lowered_before[hi + 1] > lowered_before[lo]):
            flagged.append(i)
    return flagged
