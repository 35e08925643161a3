"""GPU state from NVML (nvidia-ml-py, imported as ``pynvml``): clocks, temperature, power, throttling.

A sweep takes a :func:`snapshot` before and after each case; a case whose snapshot shows a
throttle reason other than idle / application clocks / none is flagged as throttled, since its
samples may have run below the clocks of the others.

    snap, reason = snapshot(torch.device("cuda:0"))
    snap  -> {"name", "uuid", "driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz",
              "max_mem_clock_mhz", "temperature_c", "power_w", "power_limit_w",
              "throttle_reasons": [...], "throttled": bool}   or None (then reason says why)
"""

from __future__ import annotations

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


def _read(pynvml: Any, handle: Any) -> dict[str, Any]:
    def get(fn: Any, *args: Any) -> Any:
        # a field the board does not support is None; the other fields still count
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    def watts(milliwatts: int | None) -> float | None:
        return None if milliwatts is None else round(milliwatts / 1000.0, 1)

    # renamed in NVML 12.2; older bindings only have the throttle name
    get_reasons = (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    reasons = decode_throttle_reasons(int(get_reasons(handle)))

    def violation_ns(policy_name: str) -> int | None:
        # Cumulative time the clocks were held down by that policy since the driver loaded: two
        # readings bracket the samples, where the current reasons show only their two ends.
        policy = getattr(pynvml, policy_name, None)
        read = getattr(pynvml, "nvmlDeviceGetViolationStatus", None)
        status = None if policy is None or read is None else get(read, handle, policy)
        value = getattr(status, "violationTime", None)
        return int(value) if isinstance(value, int) else None

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
            "power": violation_ns("NVML_PERF_POLICY_POWER"),
            "thermal": violation_ns("NVML_PERF_POLICY_THERMAL"),
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


def snapshot(device: torch.device | str = "cuda") -> tuple[dict[str, Any] | None, str]:
    """(state, "") of a CUDA device, or (None, reason) when NVML cannot be read here."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"NVML describes CUDA devices; this run is on {device}"
    if not torch.cuda.is_available():
        return None, "no CUDA device is visible to torch"
    pynvml, reason = _nvml()
    if pynvml is None:
        return None, reason
    try:
        return _read(pynvml, _handle(pynvml, device)), ""
    except Exception as e:  # NVML is context for a run, never a reason to stop it
        return None, f"NVML query failed: {type(e).__name__}: {e}"
