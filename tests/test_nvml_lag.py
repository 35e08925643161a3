"""``python -m harness nvml-lag``: what its readings are taken to say, and its arguments.

The loads run on a GPU only; what a load's readings say (:func:`analyse`, :func:`summary`) is
checked here on readings made up to the cases that matter: a cap seen late, violation time that
grows after the load's end, a GPU capped before the load, a board without the counter.
"""

from __future__ import annotations

import argparse
import json

import pytest

from harness import bringup, nvml_lag
from harness.box_record import check_no_record
from harness.cli import main as cli_main
from harness.nvml import Reading
from harness.nvml_lag import Load, analyse, loads_list, summary

POWER_CAP = 0x4  # sw_power_cap: lowers the clocks
IDLE = 0x1  # gpu_idle: benign


def _reading(t_ms: float, reasons: int = 0, power_ms: float | None = 0.0, sm: int | None = None) -> Reading:
    t = 100.0 + t_ms / 1e3
    power = None if power_ms is None else int(power_ms * 1e6)
    return Reading(t, t + 0.0016, reasons, power, 0 if power is not None else None, sm)


def _load(idle, during, after, launch_ms: float = 0.0, done_ms: float = 20.0) -> Load:
    return Load(20.0, 12, 100.0 + launch_ms / 1e3, 100.0 + done_ms / 1e3, idle, during, after)


def test_a_cap_seen_late_and_violation_time_after_the_end_are_measured() -> None:
    idle = [_reading(-10, IDLE, 5.0), _reading(-5, IDLE, 5.0)]
    during = [
        _reading(1, 0, 5.0),
        _reading(3, POWER_CAP, 5.0),
        _reading(6, POWER_CAP, 7.0),
        _reading(18, 0, 12.0),
    ]
    after = [_reading(21, 0, 14.0), _reading(24, 0, 14.0), _reading(30, 0, 16.5), _reading(40, 0, 16.5)]
    got = analyse(_load(idle, during, after))
    assert got["load_ms"] == 20.0 and got["readings"] == {"idle": 2, "during": 4, "after": 4}
    assert got["first_capped_reading_ms"] == 3.0
    assert got["first_power_violation_growth_ms"] == 6.0
    # 12.0 at the last reading during the load, 14.0 at the first begun after its end (which may
    # hold the load's last moments), 16.5 read 10 ms after the end (late, whatever the load did)
    assert got["power_violation_during_ms"] == 7.0
    assert got["power_violation_at_end_ms"] == 2.0 and got["power_violation_after_ms"] == 2.5
    assert got["last_growth_after_end_ms"] == 10.0
    assert got["idle_capped_readings"] == 0 and got["idle_power_violation_ms"] == 0.0
    assert got["capped_readings"] == {"during": 2, "after": 0}
    assert got["reason_masks"] == ["0x0", "0x1", "0x4"]


def test_the_clock_is_read_back_at_full_while_the_cap_reason_stays() -> None:
    """A load whose clock fell to 1500 MHz (of 1980) and is read back at 1965 from 60 ms after its
    end while the cap reason stays set to 200 ms: the last lowered reading is 40 ms after the end
    (under 98 % of 1980, 1940.4 MHz), and the readings after it capped at 1965 are the ones a
    flag no longer counts. Without the maximum, or on a board without clocks, these are None."""
    idle = [_reading(-10, 0, 0.0, sm=1980), _reading(-5, 0, 0.0, sm=1980)]
    during = [_reading(5, POWER_CAP, 2.0, sm=1700), _reading(15, POWER_CAP, 9.0, sm=1500)]
    after = [
        _reading(25, POWER_CAP, 12.0, sm=1515),
        _reading(60, POWER_CAP, 40.0, sm=1935),
        _reading(80, POWER_CAP, 60.0, sm=1965),
        _reading(220, POWER_CAP, 200.0, sm=1965),
        _reading(300, 0, 200.0, sm=1980),
    ]
    got = analyse(_load(idle, during, after), max_sm_mhz=1980)
    assert got["lowest_sm_mhz"] == {"during": 1500, "after": 1515}
    assert got["last_lowered_clock_after_end_ms"] == 40.0
    assert got["capped_readings_after_at_full_clock"] == 2
    blind = analyse(_load(idle, during, after))
    assert (
        blind["last_lowered_clock_after_end_ms"] is None
        and blind["capped_readings_after_at_full_clock"] is None
    )
    assert blind["lowest_sm_mhz"] == {"during": 1500, "after": 1515}
    plain = [_reading(t, POWER_CAP) for t in (-5, 5, 25, 60)]
    got = analyse(_load(plain[:1], plain[1:2], plain[2:]), max_sm_mhz=1980)
    assert got["lowest_sm_mhz"] == {"during": None, "after": None}
    assert (
        got["last_lowered_clock_after_end_ms"] is None and got["capped_readings_after_at_full_clock"] is None
    )
    both = summary([analyse(_load(idle, during, after), max_sm_mhz=1980)] * 2)
    assert (
        both["latest_lowered_clock_after_end_ms"] == 40.0 and both["capped_readings_after_at_full_clock"] == 4
    )


def test_a_load_never_capped_has_no_onset() -> None:
    flat = [_reading(t) for t in (-5, 1, 10, 25, 35)]
    got = analyse(_load(flat[:1], flat[1:3], flat[3:]))
    assert got["first_capped_reading_ms"] is None and got["first_power_violation_growth_ms"] is None
    assert got["power_violation_during_ms"] == 0.0 and got["power_violation_after_ms"] == 0.0
    assert got["power_violation_at_end_ms"] == 0.0 and got["last_growth_after_end_ms"] is None


def test_growth_across_the_end_alone_is_not_counted_late() -> None:
    """A counter with no lag: the load's last moments reach the first reading begun after its
    end, and nothing grows after that."""
    idle = [_reading(-5, 0, 1.0)]
    during = [_reading(0.5, POWER_CAP, 1.0), _reading(2.1, POWER_CAP, 2.6)]
    after = [_reading(3.7, 0, 3.0), _reading(5.3, 0, 3.0), _reading(6.9, 0, 3.0)]
    got = analyse(_load(idle, during, after, done_ms=3.0))
    assert got["power_violation_at_end_ms"] == 0.4
    assert got["power_violation_after_ms"] == 0.0 and got["last_growth_after_end_ms"] is None
    assert summary([got])["after_share"] == 0.0


def test_a_board_without_the_counter_gives_none_not_zero() -> None:
    got = analyse(
        _load([_reading(-5, power_ms=None)], [_reading(2, POWER_CAP, None)], [_reading(25, power_ms=None)])
    )
    assert got["first_capped_reading_ms"] == 2.0
    assert got["first_power_violation_growth_ms"] is None
    assert got["power_violation_during_ms"] is None and got["power_violation_after_ms"] is None
    assert got["power_violation_at_end_ms"] is None and got["idle_power_violation_ms"] is None
    board = summary([got])
    assert board["power_violation_ms"] == {"during": None, "at_end": None, "after": None}
    assert board["after_share"] is None and board["latest_first_growth_ms"] is None
    assert board["capped_loads"] == 1


@pytest.mark.parametrize("phase", ["idle", "during", "after"])
def test_a_phase_without_readings_is_an_error_naming_it(phase) -> None:
    parts = {"idle": [_reading(-5)], "during": [_reading(2)], "after": [_reading(25)]} | {phase: []}
    with pytest.raises(ValueError, match=f"no {phase} reading"):
        analyse(_load(parts["idle"], parts["during"], parts["after"]))


def test_the_summary_leaves_out_loads_started_on_a_capped_or_counting_gpu() -> None:
    late = analyse(
        _load(
            [_reading(-5)],
            [_reading(4, POWER_CAP, 0.0), _reading(15, 0, 6.0)],
            [_reading(21, 0, 7.0), _reading(30, 0, 8.0)],
        )
    )
    capped_idle = analyse(
        _load(
            [_reading(-9, POWER_CAP, 0.0), _reading(-5, POWER_CAP, 50.0)],
            [_reading(2, POWER_CAP, 60.0)],
            [_reading(40, 0, 200.0)],
        )
    )
    got = summary([late, capped_idle])
    assert got["loads"] == 2 and got["loads_from_uncapped_idle"] == 1 and got["capped_loads"] == 1
    assert got["latest_first_growth_ms"] == 15.0 and got["latest_growth_after_end_ms"] == 10.0
    assert got["power_violation_ms"] == {"during": 6.0, "at_end": 1.0, "after": 1.0}
    assert got["after_share"] == 0.125
    assert summary([])["after_share"] is None


def test_loads_are_positive_milliseconds() -> None:
    assert loads_list("2, 20,400") == (2.0, 20.0, 400.0)
    for bad in ("", " , ", "0", "2,-1", "a", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="milliseconds"):
            loads_list(bad)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--loads", "0"], "--loads"),
        (["--idle", "0"], "--idle"),
        (["--tail", "-1"], "--tail"),
    ],
)
def test_bad_arguments_exit_2_naming_the_argument(argv, named, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["nvml-lag", *argv])
    assert exc.value.code == 2 and named in capsys.readouterr().err


def test_without_a_gpu_it_says_so_and_exits_2(capsys, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["nvml-lag"]) == 2
    assert "error: nvml-lag: no CUDA device is visible to torch" in capsys.readouterr().err


def test_an_out_holding_a_record_is_refused_but_a_bringups_folder(tmp_path) -> None:
    (tmp_path / nvml_lag.OUTPUT_FILE).write_text("{}")
    with pytest.raises(ValueError, match=f"already holds {nvml_lag.OUTPUT_FILE}"):
        check_no_record(str(tmp_path), nvml_lag.OUTPUT_FILE)
    (tmp_path / bringup.RECORD_FILE).write_text("{}")
    check_no_record(str(tmp_path), nvml_lag.OUTPUT_FILE)


def test_a_failed_query_among_the_readings_stops_the_measurement() -> None:
    class Failing:
        failed = "NVML query failed: NVMLError: Unknown Error"
        readings: list[Reading] = []

    with pytest.raises(RuntimeError, match="NVML query failed"):
        nvml_lag._taken(Failing())


def test_the_bringup_step_writes_into_its_folder_and_needs_pynvml() -> None:
    step = {s.name: s for s in bringup.plan(bringup.Box(gpus=1))}["nvml-lag"]
    assert step.argv == ("-m", "harness", "nvml-lag", "--out", "{out}")
    assert step.skip.__name__ == "_needs_pynvml"


@pytest.mark.gpu
def test_the_command_runs_on_this_gpu(tmp_path, capsys) -> None:
    """Two short loads with short idle and tail phases: the record holds each load's analysis and
    the summary (the numbers are the board's; here only their shape and signs)."""
    pytest.importorskip("pynvml")
    argv = ["nvml-lag", "--loads", "2,10", "--idle", "0.05", "--tail", "0.05", "--out", str(tmp_path)]
    assert cli_main(argv) == 0
    record = json.loads((tmp_path / nvml_lag.OUTPUT_FILE).read_text())
    assert record["schema"] == nvml_lag.SCHEMA and record["matmul"]["ms"] > 0
    assert [x["asked_ms"] for x in record["loads"]] == [2.0, 10.0]
    for x in record["loads"]:
        assert x["matmuls"] >= 1 and x["load_ms"] > 0
        assert all(n >= 1 for n in x["readings"].values())
    assert record["summary"]["loads"] == 2
    assert "nvml-lag: {" in capsys.readouterr().out


def test_each_load_is_read_before_while_and_after_it_runs(monkeypatch) -> None:
    """run_loads on the CPU, with torch.cuda's synchronize and events stood in for and a poller
    that counts its reads: every phase of every load has a reading, even a load done before the
    first query and phases shorter than a reading; the loads' lengths set their matmul counts."""
    import torch

    class Done:
        def record(self) -> None:
            pass

        def query(self) -> bool:
            return True

    class Counting:
        def __init__(self) -> None:
            self.readings: list[Reading] = []
            self.failed = ""

        def clear(self) -> None:
            self.readings = []

        def read(self) -> None:
            self.readings.append(_reading(0.0))

    monkeypatch.setattr(nvml_lag, "MATMUL_N", 32)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Event", Done)
    matmul_ms, loads = nvml_lag.run_loads(torch.device("cpu"), Counting(), (1.0, 50.0), 1e-9, 1e-9)
    assert matmul_ms > 0 and [x.asked_ms for x in loads] == [1.0, 50.0]
    assert loads[0].matmuls >= 1 and loads[1].matmuls > loads[0].matmuls
    for x in loads:
        assert x.idle and x.during and x.after and x.t_launch <= x.t_done
        analyse(x)
