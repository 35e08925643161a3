"""Timing statistics, the sample-count policy, cold-L2 choices, NVML decoding and the roofline.

The statistics and policies are pure and run on the CPU. ``measure`` itself runs on the CPU
with the host clock (its plumbing: warm-up, budgets, rotation, early stop); the CUDA-event
and CUDA-graph paths are ``gpu``-marked.
"""

from __future__ import annotations

import builtins
import fcntl
import itertools
import os
import stat
import statistics
import threading
import time
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import nvml, timing
from harness.roofline import Ceilings, floor_ms, measure_ceilings, throughput
from harness.timing import (
    GpuLockError,
    exclusive_gpu,
    is_stable,
    measure,
    median_ci,
    quantile,
    rotation_sets,
    round_sig,
    sample_budget,
    summarize,
)

SMALL_FLUSH = 1 << 16  # keeps CPU samples cheap; the flush size is not what these tests check
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---------------------------------------------------------------------------------------------
# Statistics


def test_quantile_matches_numpy_linear_interpolation() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 37):
        x = sorted(rng.lognormal(size=n).tolist())
        for q in (0.0, 0.25, 0.5, 0.75, 1.0):
            assert quantile(x, q) == pytest.approx(float(np.percentile(x, 100 * q)))


def test_summarize_gives_median_quartiles_iqr_and_range() -> None:
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0, 100.0])
    assert (s.n, s.median_ms, s.min_ms, s.max_ms) == (6, 3.5, 1.0, 100.0)
    assert (s.q1_ms, s.q3_ms) == (2.25, 4.75)
    assert s.iqr_ms == pytest.approx(2.5)


def test_summarize_rejects_no_samples_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="samples_ms"):
        summarize([])


def test_median_ci_brackets_the_median_and_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(1)
    few = rng.normal(10.0, 1.0, size=20).tolist()
    many = rng.normal(10.0, 1.0, size=2000).tolist()
    lo_f, hi_f = median_ci(few)
    lo_m, hi_m = median_ci(many)
    assert lo_f <= statistics.median(few) <= hi_f
    assert lo_m <= statistics.median(many) <= hi_m
    assert hi_m - lo_m < (hi_f - lo_f) / 3


def test_median_ci_of_fewer_than_six_samples_is_their_range() -> None:
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_is_stable_accepts_tight_samples_and_rejects_spread_ones() -> None:
    tight = [1.0 + 0.001 * (i % 5) for i in range(40)]
    spread = [1.0 + 0.2 * (i % 5) for i in range(40)]
    assert is_stable(tight, rel_ci=0.01)
    assert not is_stable(spread, rel_ci=0.01)


def test_is_stable_holds_each_end_of_the_interval_to_rel_ci_not_its_half_width() -> None:
    """A skewed interval (0.999, 1.019) around a median of 1.0: half its width is 1 %, but its slow
    end is +1.9 %, past the promised +-1 %."""
    skewed = [0.990] * 5 + [0.999] + [1.000] * 8 + [1.019] + [1.05] * 5
    assert median_ci(skewed) == (0.999, 1.019)
    assert not is_stable(skewed, rel_ci=0.01)
    assert is_stable(skewed, rel_ci=0.02)


@pytest.mark.parametrize("n", [6, 7, 20, 21, 100, 101])
def test_the_median_interval_takes_the_same_rank_from_each_end(n: int) -> None:
    lo, hi = median_ci(list(range(n)))
    assert lo + hi == n - 1  # symmetric about the median's rank (n - 1) / 2
    assert lo < (n - 1) / 2 < hi


def test_sample_budget_caps_a_fast_call_at_max_samples_without_a_note() -> None:
    assert sample_budget(0.01, min_samples=20, max_samples=200, max_time_s=2.0) == (200, "")


def test_sample_budget_gives_a_slow_call_fewer_samples_and_says_so() -> None:
    n, note = sample_budget(33.0, min_samples=20, max_samples=200, max_time_s=0.5)
    assert n == 15
    assert "fewer samples (15 < 20)" in note and "slow implementation" in note


def test_sample_budget_never_goes_below_three_samples() -> None:
    n, note = sample_budget(5000.0, min_samples=20, max_samples=200, max_time_s=1.0)
    assert n == 3 and note


def test_rotation_sets_cover_twice_l2_between_uses_and_stay_under_six_l2() -> None:
    l2 = 60 << 20
    for ws in (1 << 20, 7 << 20, 50 << 20, 100 << 20, 110 << 20, 130 << 20, 180 << 20):
        n = rotation_sets(ws, l2)
        assert n >= 2
        assert (n - 1) * ws >= 2 * l2
        assert n * ws <= 6 * l2


def test_rotation_sets_choose_flushing_for_a_working_set_above_three_l2() -> None:
    assert rotation_sets(181 << 20, 60 << 20) == 0
    assert rotation_sets(230 << 20, 60 << 20) == 0


def test_rotate_or_flush_is_monotonic_in_the_working_set() -> None:
    """One prefix series must not switch between rotating (the kernel's code stays in L2) and
    flushing (it is fetched from DRAM) back and forth: rotate up to some size, flush beyond."""
    l2 = 60 << 20
    modes = [rotation_sets(ws, l2) > 0 for ws in range(1 << 20, 8 * l2, 1 << 20)]
    first_flush = modes.index(False)
    assert all(modes[:first_flush]) and not any(modes[first_flush:])
    assert first_flush == 180  # 3x L2, in MiB


def test_round_sig_keeps_four_significant_digits() -> None:
    assert round_sig(0.0123456) == 0.01235
    assert round_sig(33.33333) == 33.33
    assert round_sig(123456.0) == 123500.0
    assert round_sig(0.0) == 0.0


# ---------------------------------------------------------------------------------------------
# measure() on the CPU


def test_measure_stops_at_min_samples_once_the_median_is_stable() -> None:
    t = measure(
        lambda: None,
        device="cpu",
        warmup=1,
        min_samples=8,
        max_samples=500,
        rel_ci=10.0,
        l2_bytes=SMALL_FLUSH,
    )
    assert t.stats.n == len(t.samples_ms) == 8
    assert t.note == ""
    assert t.cold_l2.startswith("flush")


def test_ceilings_count_a_copy_as_read_and_write_and_a_matmul_as_2n_cubed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ceilings' arithmetic on known times: a copy of 1 GiB in 1 ms moves 2 GiB (2147.48 GB/s);
    a 1024^3 matmul in 1 ms does 2 x 1024^3 FLOPs (2.147 TFLOP/s)."""
    import types

    import harness.roofline

    def timing(ms: float) -> object:
        return types.SimpleNamespace(median_ms=ms, stats=types.SimpleNamespace(n=10), cold_l2="flush")

    monkeypatch.setattr(harness.roofline, "_time_copy", lambda *a: timing(1.0))
    monkeypatch.setattr(harness.roofline, "_time_matmul", lambda *a: timing(1.0))
    monkeypatch.setattr(harness.roofline, "_time_empty_kernel", lambda *a: timing(0.004))
    c = measure_ceilings("cpu", copy_bytes=2**30, matmul_n=1024)
    assert c.copy_bandwidth_gbs == pytest.approx(2 * 2**30 / 1e-3 / 1e9) == pytest.approx(2147.483648)
    assert c.bf16_tflops == pytest.approx(2 * 1024**3 / 1e-3 / 1e12) == pytest.approx(2.147483648)
    assert c.empty_kernel_ms == 0.004
    # and the floor of a case is the slower of the two at those rates
    assert floor_ms(2_147_483_648, 0, c) == pytest.approx(1.0)
    assert floor_ms(0, 2_147_483_648, c) == pytest.approx(1.0)


def test_every_cold_sample_follows_a_flush_of_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """DESIGN.md's cold L2: a flush before each timed call (and each warm-up), not a label."""
    import harness.timing

    log: list[str] = []
    flush = harness.timing.L2Flush.__call__
    monkeypatch.setattr(
        harness.timing.L2Flush, "__call__", lambda self: (log.append("flush"), flush(self))[1]
    )
    t = measure(
        lambda: log.append("call"), device="cpu", warmup=2, min_samples=6, max_samples=6, rel_ci=10.0,
        l2_bytes=SMALL_FLUSH,
    )  # fmt: skip
    assert len(t.samples_ms) == 6 and log.count("call") >= 6 + 2
    assert log == ["flush", "call"] * (len(log) // 2), log


def test_the_flush_is_outside_the_timed_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that takes 20 ms before an instant call: if the clock started before the flush,
    every sample would read >= 20 ms."""
    import harness.timing

    monkeypatch.setattr(harness.timing.L2Flush, "__call__", lambda self: time.sleep(0.02))
    t = measure(
        lambda: None, device="cpu", warmup=1, min_samples=4, max_samples=4, rel_ci=10.0, l2_bytes=SMALL_FLUSH
    )
    assert max(t.samples_ms) < 5.0, t.samples_ms


def test_measure_keeps_sampling_up_to_max_samples_while_unstable() -> None:
    # calls alternate between ~0 and 2 ms: the median's interval never gets within 1 %
    durations = iter([0.0, 0.002] * 100)
    t = measure(
        lambda: time.sleep(next(durations)), device="cpu", warmup=1, min_samples=5, max_samples=40,
        rel_ci=0.01, l2_bytes=SMALL_FLUSH,
    )  # fmt: skip
    assert len(t.samples_ms) == 40


def test_measure_gives_a_slow_call_fewer_samples_within_its_time_budget() -> None:
    t = measure(
        lambda: time.sleep(0.02), device="cpu", warmup=1, min_samples=20, max_samples=100, max_time_s=0.1,
        l2_bytes=SMALL_FLUSH,
    )  # fmt: skip
    assert 3 <= len(t.samples_ms) < 20
    assert "fewer samples" in t.note
    assert t.stats.median_ms >= 20.0


def test_measure_rotates_through_every_input_set_without_flushing() -> None:
    calls = [0, 0, 0]

    def make(i: int):
        def call() -> None:
            calls[i] += 1

        return call

    t = measure(make(0), rotate=[make(1), make(2)], device="cpu", warmup=3, min_samples=9, max_samples=9)
    assert t.cold_l2 == "rotate 3 input sets"
    assert len(t.samples_ms) == 9
    # three warm-up calls then nine samples, in turn: each set runs four times
    assert calls == [4, 4, 4]


def test_measure_rejects_graph_mode_off_cuda_and_unknown_modes() -> None:
    with pytest.raises(ValueError, match="mode 'graph' needs a CUDA device"):
        measure(lambda: None, mode="graph", device="cpu")
    with pytest.raises(ValueError, match="mode must be one of"):
        measure(lambda: None, mode="warm", device="cpu")


def test_measure_rejects_min_samples_above_max_samples() -> None:
    with pytest.raises(ValueError, match="min_samples=30, max_samples=10"):
        measure(lambda: None, device="cpu", min_samples=30, max_samples=10)


# ---------------------------------------------------------------------------------------------
# The GPU lock


def _try_lock(path: Path) -> bool:
    """Whether another holder could take the lock on ``path`` now (asked from another thread:
    ``flock`` locks belong to open files, so a second open conflicts even in one process)."""

    def attempt() -> bool:
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    result = []
    worker = threading.Thread(target=lambda: result.append(attempt()))
    worker.start()
    worker.join()
    return result == [True]


def test_exclusive_gpu_holds_the_lock_until_the_block_ends(tmp_path) -> None:
    path = tmp_path / "gpu.lock"
    with exclusive_gpu(path):
        assert "pid" in path.read_text()
        assert not _try_lock(path)
    assert _try_lock(path)


def test_exclusive_gpu_creates_a_lock_file_every_user_can_open(tmp_path) -> None:
    path = tmp_path / "gpu.lock"
    umask = os.umask(0)  # the mode asked for, without this process's umask
    try:
        with exclusive_gpu(path):
            pass
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666


def test_exclusive_gpu_locks_another_users_lock_file_it_may_only_read(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpu.lock"
    path.write_text("")
    # A file of another user with mode 0o644 (the tests may run as root, whom modes do not
    # stop): this user's opening it for writing is refused, by either way of opening it.
    real_os_open, real_open = os.open, builtins.open

    def refused(file: object) -> PermissionError:
        return PermissionError(13, "Permission denied", str(file))

    def os_open(file, flags, *args):
        if Path(file) == path and flags & (os.O_WRONLY | os.O_RDWR):
            raise refused(file)
        return real_os_open(file, flags, *args)

    def open_(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and Path(file) == path and set(mode) & set("wa+"):
            raise refused(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    with exclusive_gpu(path):
        assert not _try_lock(path)
    assert _try_lock(path) and path.read_text() == ""


def test_exclusive_gpu_names_a_lock_file_it_cannot_open_and_what_to_do(tmp_path) -> None:
    path = tmp_path / "no-such-folder" / "gpu.lock"
    with pytest.raises(
        GpuLockError, match=rf"cannot open the GPU lock file {path}: No such file or directory"
    ):
        with exclusive_gpu(path):
            raise AssertionError("the lock was taken")


def test_exclusive_gpu_in_a_folder_it_cannot_write_says_permission_denied(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpu.lock"
    real_open = os.open

    def read_only_folder(file, flags, *args):
        if Path(file) == path and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, flags, *args)

    monkeypatch.setattr(os, "open", read_only_folder)
    with pytest.raises(GpuLockError, match=rf"{path}: Permission denied\. Remove it .* set TMPDIR"):
        with exclusive_gpu(path):
            raise AssertionError("the lock was taken")


# ---------------------------------------------------------------------------------------------
# NVML decoding (the queries themselves need a GPU)


def test_throttle_reasons_decode_bits_to_names() -> None:
    assert nvml.decode_throttle_reasons(0) == ["none"]
    assert nvml.decode_throttle_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert nvml.decode_throttle_reasons(0x1000) == ["unknown_0x1000"]


def test_idle_and_application_clocks_are_not_throttling_but_power_and_thermal_are() -> None:
    assert not nvml.is_throttled(["none"])
    assert not nvml.is_throttled(["gpu_idle", "applications_clocks_setting"])
    assert nvml.is_throttled(["gpu_idle", "sw_power_cap"])
    assert nvml.is_throttled(["hw_thermal_slowdown"])


class _FakeNvml:
    """The few pynvml calls a snapshot makes, answering as an H200 near its power cap would."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return "GPU-0000"

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlDeviceGetClockInfo(self, h, which):
        return {1: 1755, 2: 3201}[which]

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return {1: 1980, 2: 3201}[which]

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 71

    def nvmlDeviceGetPowerUsage(self, h):
        return 698_400

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4

    NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL = 0, 1

    def nvmlDeviceGetViolationStatus(self, h, policy):
        if policy == self.NVML_PERF_POLICY_THERMAL:
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(referenceTime=123, violationTime=4_500_000)


def test_nvml_read_decodes_clocks_power_and_throttling_and_tolerates_unsupported_fields() -> None:
    snap = nvml._read(_FakeNvml(), handle=None)
    assert snap["name"] == "NVIDIA H200" and snap["sm_clock_mhz"] == 1755 and snap["max_sm_clock_mhz"] == 1980
    assert snap["power_w"] == 698.4 and snap["power_limit_w"] is None
    assert snap["throttle_reasons"] == ["sw_power_cap"] and snap["throttled"] is True
    assert snap["violation_ns"] == {"power": 4_500_000, "thermal": None}


def test_nvml_snapshot_off_cuda_returns_none_with_a_reason() -> None:
    snap, reason = nvml.snapshot("cpu")
    assert snap is None and "cpu" in reason


# ---------------------------------------------------------------------------------------------
# Throttling per sample


def _reading(
    t: float,
    reasons: int = 0,
    power: int | None = 0,
    thermal: int | None = 0,
    took: float = 0.0,
    sm: int | None = None,
) -> nvml.Reading:
    return nvml.Reading(t, t + took, reasons, power, thermal, sm)


def test_a_sample_is_flagged_by_a_capped_reading_between_its_nearest_readings() -> None:
    """Readings every 1 s; a power cap (bit 0x4) read at t=3. Samples flagged are those whose
    window, from the last reading before the start to the first after the end, holds t=3."""
    readings = [_reading(float(t), 0x4 if t == 3 else 0) for t in range(7)]
    spans = [(0.2, 0.4), (1.2, 1.4), (2.2, 2.4), (3.2, 3.4), (4.2, 4.4), (2.5, 3.5)]
    assert nvml.flag_samples(spans, readings, margin_s=0.0) == [2, 3, 5]


def test_idle_and_application_clock_readings_do_not_flag_a_sample() -> None:
    readings = [_reading(0.0, 0x1), _reading(1.0, 0x2), _reading(2.0, 0x3)]
    assert nvml.flag_samples([(0.5, 0.6), (1.5, 1.6)], readings, margin_s=0.0) == []


def test_a_cap_between_two_readings_is_seen_in_the_violation_time() -> None:
    """Neither reading's current reasons show the cap that came and went between them; the
    cumulative violation time (power, then thermal) grew across the sample, and only there."""
    power = [
        _reading(0.0, power=10),
        _reading(1.0, power=10),
        _reading(2.0, power=15),
        _reading(3.0, power=15),
    ]
    assert nvml.flag_samples([(0.2, 0.8), (1.2, 1.8), (2.2, 2.8)], power, margin_s=0.0) == [1]
    thermal = [_reading(0.0, thermal=0), _reading(1.0, thermal=7), _reading(2.0, thermal=7)]
    assert nvml.flag_samples([(0.2, 0.8), (1.2, 1.8)], thermal, margin_s=0.0) == [0]
    unknown = [_reading(0.0, power=None, thermal=None), _reading(1.0, power=5, thermal=None)]
    assert nvml.flag_samples([(0.2, 0.8)], unknown, margin_s=0.0) == []


def test_the_margin_widens_a_span_to_the_reading_just_beyond_it() -> None:
    """A cap read at t=0, a clean reading at t=1: a sample from t=1.01 takes t=1 as its nearest
    reading before, unless the margin reaches back past it."""
    readings = [_reading(0.0, 0x4), _reading(1.0), _reading(2.0)]
    assert nvml.flag_samples([(1.01, 1.5)], readings, margin_s=0.0) == []
    assert nvml.flag_samples([(1.01, 1.5)], readings, margin_s=0.02) == [0]
    after = [_reading(0.0), _reading(1.99), _reading(2.01, 0x4)]  # and forward past the end
    assert nvml.flag_samples([(0.5, 1.97)], after, margin_s=0.0) == []
    assert nvml.flag_samples([(0.5, 1.97)], after, margin_s=0.03) == [0]


def test_samples_beyond_the_first_or_last_reading_take_that_reading() -> None:
    readings = [_reading(1.0, 0x4), _reading(2.0), _reading(3.0, 0x4)]
    assert nvml.flag_samples([(0.0, 0.5), (3.5, 4.0), (1.5, 1.8)], readings, margin_s=0.0) == [0, 1, 2]
    assert nvml.flag_samples([(1.5, 1.8)], readings[1:2], margin_s=0.0) == []


def test_a_reading_in_flight_at_a_samples_edge_is_inside_its_window() -> None:
    """Readings take 0.4 s here. The one begun at 1.8 was still querying when the sample ended at
    2.0, so its growth may be the sample's: the window runs to the reading begun after 2.0, across
    which the counter grew. Likewise a reading that ended after the start does not open it."""
    tail = [_reading(0.0, took=0.4), _reading(1.8, power=0, took=0.4), _reading(2.6, power=5, took=0.4)]
    assert nvml.flag_samples([(1.0, 2.0)], tail, margin_s=0.0) == [0]
    head = [_reading(0.0, power=0, took=0.4), _reading(0.8, power=5, took=0.4), _reading(2.6, power=5)]
    assert nvml.flag_samples([(1.0, 2.0)], head, margin_s=0.0) == [0]
    clean = [_reading(0.0, took=0.4), _reading(0.5, took=0.4), _reading(2.1, took=0.4)]
    assert nvml.flag_samples([(1.0, 2.0)], clean, margin_s=0.0) == []


def test_a_cap_flags_a_sample_only_where_the_sm_clock_read_in_its_window_is_lowered() -> None:
    """A cap reason read at t=1 to 3 (0x4) and the power violation time growing to t=3, as NVML
    reports for hundreds of milliseconds after a load. With the board's maximum known (1980 MHz),
    a window flags its sample only where a reading's clock is under 98 % of it (1940.4 MHz):
    1965 is not, 1935 is. Without the maximum, or with a reading whose clock is unknown, the cap
    alone flags, as before the clock was read."""
    clocks = [1980, 1500, 1935, 1965, 1980]
    readings = [
        _reading(float(t), 0x4 if 1 <= t <= 3 else 0, power=10 * min(t, 3), sm=clocks[t]) for t in range(5)
    ]
    spans = [(0.2, 0.8), (1.2, 1.8), (2.2, 2.8), (3.2, 3.8)]
    assert nvml.flag_samples(spans, readings, margin_s=0.0) == [0, 1, 2, 3]
    assert nvml.flag_samples(spans, readings, margin_s=0.0, max_sm_mhz=1980) == [0, 1, 2]
    calm = [_reading(float(t), 0x4, power=10 * t, sm=1965) for t in range(3)]
    assert nvml.flag_samples([(0.2, 0.8), (1.2, 1.8)], calm, margin_s=0.0, max_sm_mhz=1980) == []
    # a lowered clock without a cap reason or a violation time's growth flags nothing
    slow = [_reading(float(t), 0, power=0, sm=1400) for t in range(3)]
    assert nvml.flag_samples([(0.2, 0.8)], slow, margin_s=0.0, max_sm_mhz=1980) == []
    unknown = [*calm[:2], _reading(2.0, 0x4, power=20, sm=None)]
    assert nvml.flag_samples([(0.2, 0.8)], unknown, margin_s=0.0, max_sm_mhz=1980) == [0]


def test_flag_samples_refuses_no_readings_and_readings_out_of_order() -> None:
    with pytest.raises(ValueError, match="readings is empty"):
        nvml.flag_samples([(0.0, 1.0)], [])
    with pytest.raises(ValueError, match="in the order they were taken"):
        nvml.flag_samples([(0.0, 1.0)], [_reading(1.0), _reading(0.5)])
    with pytest.raises(ValueError, match="one after another"):
        nvml.flag_samples([(0.0, 1.0)], [_reading(1.0, took=0.5), _reading(1.2)])


def test_the_poller_reads_reasons_and_violation_times_with_the_host_clock() -> None:
    fake = _FakeNvml()
    poller = nvml.Poller(fake, handle=None)
    before = time.monotonic()
    poller.read()
    poller.read()
    assert len(poller.readings) == 2 and poller.failed == ""
    r = poller.readings[0]
    assert before <= r.t <= poller.readings[1].t <= time.monotonic()
    assert (r.reasons, r.power_ns, r.thermal_ns, r.sm_mhz, r.capped) == (0x4, 4_500_000, None, 1755, True)
    assert poller.max_sm_mhz == 1980
    poller.clear()
    assert poller.readings == []


def test_a_poller_whose_query_fails_stops_reading_and_says_why() -> None:
    class Broken(_FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            raise self.NVMLError("GPU is lost")

    poller = nvml.Poller(Broken(), handle=None)
    poller.read()
    assert poller.readings == [] and "GPU is lost" in poller.failed
    poller.clear()
    assert poller.failed == ""


def test_a_poller_stops_on_any_failing_query_and_on_a_counter_that_comes_and_goes() -> None:
    class Odd(_FakeNvml):
        def nvmlDeviceGetViolationStatus(self, h, policy):
            raise OSError("driver went away")

    poller = nvml.Poller(Odd(), handle=None)
    poller.read()
    assert poller.readings == [] and "driver went away" in poller.failed

    class Flaky(_FakeNvml):
        calls = 0

        def nvmlDeviceGetViolationStatus(self, h, policy):
            if policy == self.NVML_PERF_POLICY_POWER:
                Flaky.calls += 1
                if Flaky.calls == 2:
                    raise self.NVMLError("Timeout")
            return super().nvmlDeviceGetViolationStatus(h, policy)

    poller = nvml.Poller(Flaky(), handle=None)
    poller.read()
    poller.read()
    poller.read()
    assert len(poller.readings) == 1 and "some readings and not in others" in poller.failed

    class FlakyClock(_FakeNvml):
        calls = 0

        def nvmlDeviceGetClockInfo(self, h, which):
            FlakyClock.calls += 1
            if FlakyClock.calls == 2:
                raise self.NVMLError("Timeout")
            return super().nvmlDeviceGetClockInfo(h, which)

    poller = nvml.Poller(FlakyClock(), handle=None)
    poller.read()
    poller.read()
    assert len(poller.readings) == 1 and "SM clock" in poller.failed


def test_a_poller_on_a_board_without_clocks_reads_none_and_keeps_reading() -> None:
    class NoClocks(_FakeNvml):
        def nvmlDeviceGetClockInfo(self, h, which):
            raise self.NVMLError("Not Supported")

        def nvmlDeviceGetMaxClockInfo(self, h, which):
            raise self.NVMLError("Not Supported")

    poller = nvml.Poller(NoClocks(), handle=None)
    poller.read()
    poller.read()
    assert poller.failed == "" and poller.max_sm_mhz is None
    assert [r.sm_mhz for r in poller.readings] == [None, None]


def test_a_poller_off_cuda_is_none_with_a_reason() -> None:
    poller, reason = nvml.Poller.of("cpu")
    assert poller is None and "cpu" in reason


class _FakeGpu:
    """A CUDA stream on the host's clock: work runs in order, each call ``call_ms`` long, and an
    event completes when the work queued before it has."""

    def __init__(self, call_ms: float, wait_ms: float = 0.0) -> None:
        self.free_at = 0.0  # time.monotonic() when the queued work is done
        self.call_ms = call_ms
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at: float | None = None

            def record(self) -> None:
                self.at = gpu.free_at = max(gpu.free_at, time.monotonic())

            def query(self) -> bool:
                return time.monotonic() >= self.at

            def synchronize(self) -> None:
                # the host learns of the event ``wait_ms`` after it completed
                time.sleep(max(self.at - time.monotonic(), 0.0) + wait_ms / 1e3)

            def elapsed_time(self, end: Event) -> float:
                return (end.at - self.at) * 1e3

        self.Event = Event

    def call(self) -> None:
        self.free_at = max(self.free_at, time.monotonic()) + self.call_ms / 1e3

    def synchronize(self, device: object = None) -> None:
        time.sleep(max(self.free_at - time.monotonic(), 0.0))


class _CapDuringSample2:
    """A monitor whose readings show a cap (0x4) while the fake GPU runs the third call; each
    reading's value is observed as it begins and the reading takes ``read_ms``."""

    def __init__(self, ran: list[tuple[float, float]], read_ms: float) -> None:
        self.ran = ran
        self.read_ms = read_ms
        self.readings: list[nvml.Reading] = []

    def read(self) -> None:
        now = time.monotonic()
        capped = len(self.ran) > 2 and self.ran[2][0] < now < self.ran[2][1]
        time.sleep(self.read_ms / 1e3)
        self.readings.append(_reading(now, 0x4 if capped else 0, took=time.monotonic() - now))


def _sampler_on(
    gpu: _FakeGpu, monkeypatch: pytest.MonkeyPatch, read_ms: float = 0.0
) -> tuple[timing.Sampler, _CapDuringSample2, list[tuple[float, float]]]:
    """A sampler of one call on ``gpu`` (patched in for torch.cuda's events and synchronisation),
    its monitor, and each call's span on the fake GPU as the calls run."""
    monkeypatch.setattr(torch.cuda, "Event", gpu.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    ran: list[tuple[float, float]] = []

    def call() -> None:
        start = max(gpu.free_at, time.monotonic())
        gpu.call()
        ran.append((start, gpu.free_at))

    monitor = _CapDuringSample2(ran, read_ms)
    return timing.Sampler([call], torch.device("cuda"), 0, monitor), monitor, ran


@pytest.mark.parametrize(("read_ms", "call_ms"), [(0.0, 3.0), (1.5, 5.0)], ids=["instant", "slow-reads"])
def test_the_sampler_reads_the_monitor_while_samples_run_and_places_each_on_the_host_clock(
    monkeypatch: pytest.MonkeyPatch, read_ms: float, call_ms: float
) -> None:
    """On a fake GPU whose calls take ``call_ms``: the monitor is read before the batch, repeatedly
    while it runs and after it; each sample's span is where the GPU ran it on the host's clock,
    so a cap read while sample 2 ran flags that sample and not the first or the last. Readings
    that take ``read_ms`` (as NVML's 1.6 ms on an H100) are still in flight as samples end."""
    gpu = _FakeGpu(call_ms=call_ms)
    sampler, monitor, ran = _sampler_on(gpu, monkeypatch, read_ms)
    samples = sampler.samples(5)
    assert samples == pytest.approx([call_ms] * 5, abs=0.3)
    # read once before, every ~0.5 ms (plus the reading's own time) while the batch runs, once after
    assert len(monitor.readings) >= (10 if read_ms == 0 else 6)
    assert [r.t for r in monitor.readings] == sorted(r.t for r in monitor.readings)
    assert len(sampler.spans) == 5
    for (start, end), (gpu_start, gpu_end) in zip(sampler.spans, ran, strict=True):
        assert start == pytest.approx(gpu_start, abs=2e-4) and end == pytest.approx(gpu_end, abs=2e-4)
    assert any(r.capped for r in monitor.readings)
    flagged = nvml.flag_samples(sampler.spans, monitor.readings)
    assert 2 in flagged and 0 not in flagged and 4 not in flagged
    # a second batch: the first one's closing reading opens it, and its spans follow on
    before = len(monitor.readings)
    gpu.synchronize()
    sampler.samples(2)
    assert len(sampler.spans) == 7 and sampler.spans[4][1] <= sampler.spans[5][0]
    reads = [r.t for r in monitor.readings[before:]]
    assert reads and reads[0] > sampler.spans[5][0]  # none taken between the batches


def test_back_to_back_samples_spans_overlap_by_the_anchor_wait_and_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Samples with no flush between them, and an anchor the host sees 2 ms after it ran: each
    span still holds its sample's run and the spans keep their order, but a span's end, placed
    from the read after the anchor's wait, reaches 2 ms into the next sample's run. The overlap
    is the margin, no more, and a cap read while sample 2 ran flags it, not samples 0 or 4."""
    gpu = _FakeGpu(call_ms=8.0, wait_ms=2.0)
    sampler, monitor, ran = _sampler_on(gpu, monkeypatch)
    samples = sampler.samples(5)
    spans = sampler.spans
    for (start, end), (gpu_start, gpu_end) in zip(spans, ran, strict=True):
        assert start <= gpu_start + 2e-4 and end >= gpu_end - 2e-4
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(spans))
    margins_ms = [(end - start) * 1e3 - ms for (start, end), ms in zip(spans, samples, strict=True)]
    overlaps_ms = [(a[1] - b[0]) * 1e3 for a, b in itertools.pairwise(spans)]
    assert all(1.5 < m < 8.0 for m in margins_ms), margins_ms  # under a call: 0 and 2 stay apart
    assert all(0.0 < o < m + 1e-3 for o, m in zip(overlaps_ms, margins_ms, strict=False)), (
        overlaps_ms,
        margins_ms,
    )
    assert any(r.capped for r in monitor.readings)
    flagged = nvml.flag_samples(spans, monitor.readings)
    assert 2 in flagged and 0 not in flagged and 4 not in flagged


def test_measure_gives_spans_only_with_a_monitor_on_a_cuda_device() -> None:
    class Monitor:
        def read(self) -> None:
            raise AssertionError("a CPU run reads no monitor")

    t = measure(lambda: None, device="cpu", warmup=1, min_samples=3, max_samples=3, monitor=Monitor())
    assert t.spans is None and len(t.samples_ms) == 3


# ---------------------------------------------------------------------------------------------
# Roofline


CEIL = Ceilings(
    copy_bandwidth_gbs=4000.0, bf16_tflops=800.0, method="test", copy_bytes=0, matmul_n=0,
    copy_median_ms=0.0, matmul_median_ms=0.0,
)  # fmt: skip


def test_floor_is_bandwidth_bound_for_decode_shapes() -> None:
    # 4 GB at 4000 GB/s = 1 ms; 8 GFLOP at 800 TFLOP/s = 0.01 ms
    assert floor_ms(4_000_000_000, 8_000_000_000, CEIL) == pytest.approx(1.0)


def test_floor_is_compute_bound_for_large_trees() -> None:
    # 4 MB = 0.001 ms; 1.6 TFLOP at 800 TFLOP/s = 2 ms
    assert floor_ms(4_000_000, 1_600_000_000_000, CEIL) == pytest.approx(2.0)


def test_throughput_reports_rates_and_percent_of_floor() -> None:
    tp = throughput(4_000_000_000, 8_000_000_000, 2.0, CEIL)
    assert tp.bandwidth_gbs == pytest.approx(2000.0)
    assert tp.tflops == pytest.approx(4.0)
    assert tp.floor_ms == pytest.approx(1.0)
    assert tp.pct_of_floor == pytest.approx(50.0)


def test_throughput_without_ceilings_has_no_floor() -> None:
    tp = throughput(1000, 1000, 1.0, None)
    assert tp.floor_ms is None and tp.pct_of_floor is None


def test_ceilings_round_trip_through_json() -> None:
    assert Ceilings.from_json(CEIL.to_json()) == CEIL
    with pytest.raises(ValueError, match="bf16_tflops"):
        Ceilings.from_json({"copy_bandwidth_gbs": 1.0})
    # runs from before the empty kernel was timed load with 0 (not measured)
    older = {
        k: v for k, v in replace(CEIL, empty_kernel_ms=0.004).to_json().items() if k != "empty_kernel_ms"
    }
    assert Ceilings.from_json(older).empty_kernel_ms == 0.0


def test_measure_ceilings_runs_with_small_sizes_on_the_cpu() -> None:
    c = measure_ceilings("cpu", copy_bytes=1 << 22, matmul_n=128)
    assert c.copy_bandwidth_gbs > 0 and c.bf16_tflops > 0
    assert c.copy_bytes == 1 << 22 and c.matmul_n == 128
    assert "random normal" in c.method
    assert c.empty_kernel_ms > 0 and "empty kernels" in c.method


# ---------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@needs_cuda
def test_cold_and_graph_modes_time_a_matmul_with_cuda_events() -> None:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    cold = measure(lambda: torch.mm(a, a, out=out), mode="cold", min_samples=10, max_samples=50)
    graph = measure(lambda: torch.mm(a, a, out=out), mode="graph", min_samples=10, max_samples=50)
    for t in (cold, graph):
        assert len(t.samples_ms) >= 10 and all(s > 0 for s in t.samples_ms)
        assert t.cold_l2.startswith("flush")
    # one 2048^3 matmul is ~17 GFLOP: between a microsecond and a second on any GPU
    assert 1e-3 < cold.median_ms < 1e3
    assert graph.median_ms == pytest.approx(cold.median_ms, rel=0.5)


@pytest.mark.gpu
@needs_cuda
def test_nvml_snapshot_reads_clocks_and_throttle_reasons() -> None:
    snap, reason = nvml.snapshot("cuda")
    if snap is None:
        pytest.skip(f"NVML unavailable: {reason}")
    assert snap["sm_clock_mhz"] > 0 and snap["uuid"].startswith("GPU-")
    assert isinstance(snap["throttle_reasons"], list) and isinstance(snap["throttled"], bool)


@pytest.mark.gpu
@needs_cuda
def test_a_monitored_measure_places_every_sample_within_its_own_run_in_time_order() -> None:
    poller, reason = nvml.Poller.of("cuda")
    if poller is None:
        pytest.skip(f"NVML unavailable: {reason}")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    began = time.monotonic()
    t = measure(lambda: torch.mm(a, a, out=out), min_samples=30, max_samples=30, monitor=poller)
    ended = time.monotonic()
    assert t.spans is not None and len(t.spans) == len(t.samples_ms) == 30
    assert all(began < start < end < ended for start, end in t.spans)
    pairs = list(zip(t.spans, t.spans[1:], strict=False))
    assert all(prev[0] < nxt[0] and prev[1] < nxt[1] for prev, nxt in pairs)
    # each span holds its sample whole: the sample's own length (both come from the same events)
    # plus the time the host took to see the batch's anchor event run on the idle GPU (its start
    # placed from the read before the anchor's record, its end from the read after its wait), which
    # is the same for every sample of a batch and well under a millisecond on an idle GPU
    excess_ms = [(end - start) * 1e3 - ms for (start, end), ms in zip(t.spans, t.samples_ms, strict=True)]
    assert all(-1e-3 < x < 5.0 for x in excess_ms), excess_ms
    # a span runs from the earliest to the latest host time its sample can have run, so neighbours
    # may overlap, by no more than that margin: the GPU ran them one after the other
    overlap_ms = [(prev[1] - nxt[0]) * 1e3 for prev, nxt in pairs]
    assert all(o < x + 1e-3 for o, x in zip(overlap_ms, excess_ms, strict=False)), (overlap_ms, excess_ms)
    # 30 samples are two batches (the pilot's, then the rest): at most two values of the excess,
    # each read within the events' resolution
    ordered = sorted(excess_ms)
    assert sum(b - a > 5e-3 for a, b in zip(ordered, ordered[1:], strict=False)) <= 1, ordered
    # the batches' readings: one before and one after each, more while it ran
    assert poller.failed == "" and len(poller.readings) >= 4
    assert all(0 <= i < 30 for i in nvml.flag_samples(t.spans, poller.readings))


@pytest.mark.gpu
@needs_cuda
def test_measure_ceilings_on_the_gpu_reports_plausible_numbers() -> None:
    c = measure_ceilings("cuda", copy_bytes=1 << 30, matmul_n=4096)
    assert 100 < c.copy_bandwidth_gbs < 20_000
    assert 10 < c.bf16_tflops < 5_000
    # an empty kernel between two events: a microsecond or more, far below a millisecond
    assert 5e-4 < c.empty_kernel_ms < 0.5


def test_the_event_clock_reads_the_gpu_time_between_a_start_and_its_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pytest-benchmark takes ``stop - start`` of its timer around the target: with the event
    clock that is the GPU time between two events (here a fake GPU timeline), not host time."""
    gpu_now = [0.0]  # ms on the fake GPU's timeline

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at: float | None = None
            self.synced = False

        def record(self) -> None:
            self.at = gpu_now[0]

        def synchronize(self) -> None:
            self.synced = True

        def elapsed_time(self, end: FakeEvent) -> float:
            assert end.synced, "elapsed_time read before the stop event completed"
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    clock = timing.EventClock()
    start = clock()
    gpu_now[0] += 2.5  # the call: 2.5 ms on the GPU
    time.sleep(0.01)  # host time does not count
    stop = clock()
    assert stop - start == pytest.approx(0.0025)
    gpu_now[0] += 100.0  # between rounds: not timed
    start = clock()
    gpu_now[0] += 1.0
    assert clock() - start == pytest.approx(0.001)
    clock()  # a start whose stop never comes (the target raised)
    gpu_now[0] += 50.0
    clock.reset()
    start = clock()
    gpu_now[0] += 0.5
    assert clock() - start == pytest.approx(0.0005)
