"""``python -m harness nvml-lag``: how late NVML reports a power cap on this GPU.

A sweep flags a sample when the NVML readings around it show a cap (:mod:`harness.nvml`,
``flag_samples``), which holds only as far as NVML reports a cap while it lasts. The power
violation time can show up late: in 49f667a's sweep one row gained 35.5 ms of it between its two
snapshots while the readings across its samples saw none (README, "Choices made where the
design was silent", Throttling). This command measures that lag on the box it runs on. From an
idle GPU it runs loads of several lengths (bf16 8192^3 matmuls back to back, 2 ms to 400 ms),
reading NVML (:class:`harness.nvml.Poller`: the clock-event reasons, the power and thermal
violation times) in a loop before, during and after each, and records per load:

* when the first reading with a clock-lowering reason, and the first with more power violation
  time than the idle GPU's last reading, began after the load's launch (ms);
* the violation time gained while the load ran, across its end (from the last reading during
  it, which may have taken its values before the end, to the first begun after it), and after
  its end (between readings begun after it: what a window around the load would miss), and when
  the last growth after the end was read;
* the idle GPU's own readings (a GPU already capped at idle leaves the onset unmeasured);
* where NVML gives the SM clock (a reading's fourth query) and the board's maximum: the lowest
  clock read during the load and after it, when the last reading after the end with the clock
  under ``CLOCK_LOWERED_BELOW`` of the maximum was taken, and how many readings after the end
  showed a cap reason at a clock above that line (the ones ``flag_samples`` no longer counts).

    python -m harness nvml-lag [--loads MS,MS,...] [--idle S] [--tail S] [--out DIR]

(default loads: 2, 5, 20, 100 and 400 ms, twice)

writes ``nvml-lag.json`` into ``DIR`` (default ``reports/<UTC time>-nvml-lag-<gpu>-<sha7>/``);
the bring-up's ``nvml-lag`` step writes it into the bring-up's folder. ``--out`` follows
mma-peak's rules: a folder holding a run's results or an ``nvml-lag.json`` is refused (exit 2),
but for a bring-up's. A GPU whose NVML cannot be read exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from harness import box_record
from harness.cli import positive_number, shown
from harness.nvml import Poller, Reading, clock_line

OUTPUT_FILE = "nvml-lag.json"
SCHEMA = "verify-attention/nvml-lag"
SCHEMA_VERSION = 1
DEFAULT_LOADS_MS = (2.0, 5.0, 20.0, 100.0, 400.0, 2.0, 5.0, 20.0, 100.0, 400.0)
DEFAULT_IDLE_S = 1.5
DEFAULT_TAIL_S = 0.6
MATMUL_N = 8192


@dataclass(frozen=True)
class Load:
    """One load and the readings around it: ``idle`` before its launch, ``during`` from its
    launch until its last event was seen done, ``after`` for the tail. Times are the host's
    ``time.monotonic()``, as the readings'."""

    asked_ms: float
    matmuls: int
    t_launch: float
    t_done: float
    idle: list[Reading]
    during: list[Reading]
    after: list[Reading]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def _grown_ms(first: int | None, last: int | None) -> float | None:
    return None if first is None or last is None else round((last - first) / 1e6, 4)


def _lowest(readings: list[Reading]) -> int | None:
    clocks = [r.sm_mhz for r in readings if r.sm_mhz is not None]
    return min(clocks) if clocks else None


def _clock(load: Load, max_sm_mhz: int | None) -> dict[str, Any]:
    """The SM clock's fields of :func:`analyse` (module docstring); None where it is unknown."""
    lowest = {"during": _lowest(load.during), "after": _lowest(load.after)}
    line = clock_line(load.after, max_sm_mhz)
    last_lowered = None
    if line is not None:
        last_lowered = next((r.t - load.t_done for r in reversed(load.after) if r.sm_mhz < line), None)
    return {
        "lowest_sm_mhz": lowest,
        "last_lowered_clock_after_end_ms": _ms(last_lowered),
        "capped_readings_after_at_full_clock": (
            None if line is None else sum(1 for r in load.after if r.capped and r.sm_mhz >= line)
        ),
    }


def analyse(load: Load, max_sm_mhz: int | None = None) -> dict[str, Any]:
    """What the readings say of one load (module docstring); ``max_sm_mhz`` is the board's
    maximum SM clock (None where NVML does not give it). Raises ValueError when a phase has no
    reading (nothing to measure against)."""
    for phase in ("idle", "during", "after"):
        if not getattr(load, phase):
            raise ValueError(f"the load of {load.asked_ms} ms has no {phase} reading")
    base = load.idle[-1]
    seen = load.during + load.after
    first_capped = next((r.t - load.t_launch for r in seen if r.capped), None)
    counted = base.power_ns is not None
    first_growth = (
        next(
            (r.t - load.t_launch for r in seen if r.power_ns is not None and r.power_ns > base.power_ns), None
        )
        if counted
        else None
    )
    # The last reading during the load may have taken its values while the load still ran, so
    # growth from it to the first reading begun after the end straddles the end ("at_end"); only
    # growth between readings begun after the end is violation time NVML reported late ("after").
    end_of_load, first_after = load.during[-1], load.after[0]
    last_growth_after = None
    if counted:
        for previous, r in zip(load.after[:-1], load.after[1:], strict=True):
            if r.power_ns is not None and previous.power_ns is not None and r.power_ns > previous.power_ns:
                last_growth_after = r.t - load.t_done
    return {
        "asked_ms": load.asked_ms,
        "matmuls": load.matmuls,
        "load_ms": _ms(load.t_done - load.t_launch),
        "readings": {"idle": len(load.idle), "during": len(load.during), "after": len(load.after)},
        "idle_capped_readings": sum(r.capped for r in load.idle),
        "idle_power_violation_ms": _grown_ms(load.idle[0].power_ns, base.power_ns),
        "first_capped_reading_ms": _ms(first_capped),
        "first_power_violation_growth_ms": _ms(first_growth),
        "power_violation_during_ms": _grown_ms(base.power_ns, end_of_load.power_ns),
        "power_violation_at_end_ms": _grown_ms(end_of_load.power_ns, first_after.power_ns),
        "power_violation_after_ms": _grown_ms(first_after.power_ns, load.after[-1].power_ns),
        "last_growth_after_end_ms": _ms(last_growth_after),
        "capped_readings": {
            "during": sum(r.capped for r in load.during),
            "after": sum(r.capped for r in load.after),
        },
        "reason_masks": sorted({hex(r.reasons) for r in (*load.idle, *seen)}),
        **_clock(load, max_sm_mhz),
    }


def _known(loads: list[dict[str, Any]], field: str) -> list[Any]:
    return [x[field] for x in loads if x[field] is not None]


def _total(loads: list[dict[str, Any]], field: str) -> float | None:
    values = _known(loads, field)
    return round(sum(values), 4) if values else None


def _latest(loads: list[dict[str, Any]], field: str) -> float | None:
    values = _known(loads, field)
    return max(values) if values else None


def summary(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the loads measured from an uncapped idle GPU: the latest first growth of the power
    violation time, the latest growth read after a load's end, the violation time read during
    the loads, across their ends and after them, and the share of it that came after (None
    where the board has no violation counter); and the latest reading after an end with the SM
    clock lowered, and the readings after the ends capped at a full clock (None where NVML gives
    no clock)."""
    clean = [x for x in loads if x["idle_capped_readings"] == 0 and x["idle_power_violation_ms"] in (0, None)]
    during, at_end, after = (
        _total(clean, f"power_violation_{phase}_ms") for phase in ("during", "at_end", "after")
    )
    whole = None if during is None else during + (at_end or 0) + (after or 0)
    return {
        "loads_from_uncapped_idle": len(clean),
        "loads": len(loads),
        "capped_loads": sum(1 for x in clean if x["first_capped_reading_ms"] is not None),
        "latest_first_growth_ms": _latest(clean, "first_power_violation_growth_ms"),
        "latest_growth_after_end_ms": _latest(clean, "last_growth_after_end_ms"),
        "power_violation_ms": {"during": during, "at_end": at_end, "after": after},
        "after_share": round(after / whole, 4) if whole and after is not None else None,
        "latest_lowered_clock_after_end_ms": _latest(clean, "last_lowered_clock_after_end_ms"),
        "capped_readings_after_at_full_clock": _total(clean, "capped_readings_after_at_full_clock"),
    }


def _taken(poller: Poller) -> list[Reading]:
    """The poller's readings since its last clear; RuntimeError when a query failed among them."""
    if poller.failed:
        raise RuntimeError(poller.failed)
    return list(poller.readings)


def _read_for(poller: Poller, seconds: float) -> list[Reading]:
    """Readings for ``seconds``, at least one."""
    poller.clear()
    stop = time.monotonic() + seconds
    poller.read()
    while time.monotonic() < stop:
        poller.read()
    return _taken(poller)


def run_loads(
    device: Any, poller: Poller, loads_ms: tuple[float, ...], idle_s: float, tail_s: float
) -> tuple[float, list[Load]]:
    """(one matmul's ms, the loads) on ``device``; RuntimeError when NVML stops answering."""
    import torch

    a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    for _ in range(3):
        torch.mm(a, a, out=b)
    torch.cuda.synchronize(device)
    start = time.monotonic()
    for _ in range(10):
        torch.mm(a, a, out=b)
    torch.cuda.synchronize(device)
    matmul_ms = (time.monotonic() - start) / 10 * 1e3
    loads = []
    for asked in loads_ms:
        n = max(1, round(asked / matmul_ms))
        idle = _read_for(poller, idle_s)
        poller.clear()
        done = torch.cuda.Event()
        torch.cuda.synchronize(device)
        t_launch = time.monotonic()
        for _ in range(n):
            torch.mm(a, a, out=b)
        done.record()
        poller.read()  # at least one reading while the load runs (it may end before the next)
        while not done.query():
            poller.read()
        t_done = time.monotonic()
        during = _taken(poller)
        after = _read_for(poller, tail_s)
        loads.append(Load(asked, n, t_launch, t_done, idle, during, after))
    return matmul_ms, loads


def loads_list(text: str) -> tuple[float, ...]:
    """An argparse ``type`` for ``--loads``: comma-separated positive milliseconds."""
    parse = positive_number("milliseconds")
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated milliseconds, e.g. 2,20,400; got {text!r}"
        )
    return tuple(parse(t) for t in items)


def main(args: argparse.Namespace) -> int:
    import torch

    if box_record.refused("nvml-lag", args.out, OUTPUT_FILE):
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    poller, why = Poller.of(device)
    if poller is None:
        print(f"error: nvml-lag: {why}", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name(device)
    print(f"nvml-lag: {name}, loads {', '.join(f'{x:g}' for x in args.loads)} ms", flush=True)
    try:
        matmul_ms, loads = run_loads(device, poller, args.loads, args.idle, args.tail)
        measured = [analyse(x, poller.max_sm_mhz) for x in loads]
    except (RuntimeError, ValueError) as e:
        print(f"error: nvml-lag: {e}", file=sys.stderr)
        return 1
    body = {
        "matmul": {"n": MATMUL_N, "ms": round(matmul_ms, 4)},
        "max_sm_mhz": poller.max_sm_mhz,
        "idle_s": args.idle,
        "tail_s": args.tail,
        "loads": measured,
        "summary": summary(measured),
    }
    path = box_record.write("nvml-lag", args.out, OUTPUT_FILE, (SCHEMA, SCHEMA_VERSION), device, body)
    if path is None:
        return 2
    for x in measured:
        print(
            f"{x['asked_ms']:>7g} ms load: first cap reason {x['first_capped_reading_ms']} ms, first violation "
            f"growth {x['first_power_violation_growth_ms']} ms, violation {x['power_violation_during_ms']} ms during "
            f"+ {x['power_violation_at_end_ms']} ms across the end + {x['power_violation_after_ms']} ms after "
            f"(last growth {x['last_growth_after_end_ms']} ms after the end; SM clock lowered until "
            f"{x['last_lowered_clock_after_end_ms']} ms after it, lowest {x['lowest_sm_mhz']['after']} MHz)"
        )
    print(f"nvml-lag: {json.dumps(body['summary'])} -> {shown(path)}")
    return 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser(
        "nvml-lag",
        help="how late NVML reports a power cap on this GPU (loads from idle, readings around them)",
        description=__doc__.split("\n\n", 1)[0],
    )
    p.add_argument(
        "--loads",
        type=loads_list,
        default=DEFAULT_LOADS_MS,
        metavar="MS,MS",
        help="the loads' lengths in ms, each from an idle GPU (default: 2,5,20,100,400 twice)",
    )
    p.add_argument(
        "--idle",
        type=positive_number("seconds"),
        default=DEFAULT_IDLE_S,
        metavar="S",
        help=f"seconds of readings on the idle GPU before each load (default {DEFAULT_IDLE_S})",
    )
    p.add_argument(
        "--tail",
        type=positive_number("seconds"),
        default=DEFAULT_TAIL_S,
        metavar="S",
        help=f"seconds of readings after each load's end (default {DEFAULT_TAIL_S})",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="folder for nvml-lag.json (default: reports/<time>-nvml-lag-<gpu>-<sha7>)",
    )
    p.set_defaults(func=main)
