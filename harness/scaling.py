"""Fixed cost and steady rate: how an implementation's time grows with the prefix.

A sweep times each implementation at several prefix lengths with everything else the same (batch,
heads, tree size, tree, layout, mode): a *series*. Per series with at least ``MIN_PREFIXES``
distinct prefix lengths, a line through the medians,

    median_ms ~= fixed_ms + ms_per_key * P,

splits the time into what a call costs whatever its prefix (the launches, the start, the merge of
the splits, the timing's own floor: an empty kernel between the same two events, the run's
``empty_kernel_ms``) and what each key of the prefix adds. The line is the one of least relative
residuals (least squares weighted by 1 / median^2): the medians span orders of magnitude and
their noise is a share of each. The same line through the rows' roofline floors gives the
floor's rate, and with it:

* ``steady_pct``: 100 x floor's rate / the implementation's rate, the % of the floor that long
  prefixes approach (what the kernel's loop sustains once the fixed cost no longer counts);
* ``half_floor_prefix``: the prefix length from which the line reaches 50 % of the floor's line,
  ``(fixed - 2 floor_fixed) / (2 floor_rate - rate)``; 0 when it does at every prefix, None when
  it never does (a steady rate below 50 %). It is the fit's, not a measured row's: below it, a
  call's % of floor is bound by its fixed cost, however fast the loop;
* ``fixed_se_ms``: the fixed cost's standard error from the residuals: a series whose shortest
  prefix already costs far more than the fixed cost extrapolates it from afar, and shows it here.
  A fixed cost within two standard errors of zero is *unresolved* (``fixed_resolved``): the line
  says nothing about it, and so nothing about where it crosses 50 % of the floor, which the
  tables then write as unresolved rather than a prefix derived from noise;
* ``worst_residual_pct``: the largest distance of a measured median from the line, in % of that
  median, which says how far the line describes the series (a change of tile config or of cold-L2
  method along the prefixes shows here).

The report shows the fits (``harness/report.py``), ``python -m harness report --scaling PATH``
prints them, and ``harness compare`` shows each series' fit in both runs beside its verdicts (not
gated). Nothing here is stored: the fits are recomputed from ``results.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.results import Results, SweepRow
from harness.text import columns

MIN_PREFIXES = 3
# What the fits are called where a sweep's end and compare print them.
TITLE = "fixed cost and steady rate per series of prefix lengths"
# How a series' label writes these params (the others by value; its prefix lengths are its points).
SERIES_LABEL = {"batch_size": "B", "num_heads": "H", "tree_size": "T"}


@dataclass(frozen=True)
class ScalingFit:
    impl: str
    mode: str
    params: tuple[tuple[str, Any], ...]  # the series' params, prefix length excluded, sorted
    configs: tuple[str, ...]  # impl_config values along the series, in prefix order, once each
    prefixes: tuple[int, ...]  # distinct, ascending
    points: int  # rows fitted (a prefix timed twice counts twice)
    fixed_ms: float
    fixed_se_ms: float  # its standard error, from the residuals: large where no prefix is short
    ms_per_key: float
    floor_fixed_ms: float | None
    floor_ms_per_key: float | None
    worst_residual_pct: float

    @property
    def steady_pct(self) -> float | None:
        if self.floor_ms_per_key is None or self.ms_per_key <= 0:
            return None
        return 100.0 * self.floor_ms_per_key / self.ms_per_key

    @property
    def fixed_resolved(self) -> bool:
        """Whether the fixed cost stands at least two standard errors from zero (module doc)."""
        # A nanosecond of slack: an exact line's zero fixed cost and zero error, in floats.
        return 2.0 * self.fixed_se_ms <= abs(self.fixed_ms) + 1e-6

    @property
    def half_floor_prefix(self) -> float | None:
        """Prefix length from which the line is within 2x the floor's line (see the module doc);
        it rests on the fixed cost, so it means something only where ``fixed_resolved``."""
        if self.floor_ms_per_key is None or self.floor_fixed_ms is None:
            return None
        over = self.fixed_ms - 2.0 * self.floor_fixed_ms  # the line's excess at P = 0
        gain = 2.0 * self.floor_ms_per_key - self.ms_per_key  # what each key takes back
        if over <= 0 and gain >= 0:
            return 0.0
        if gain <= 0:
            return None
        return over / gain

    def label(self) -> str:
        p = dict(self.params)
        parts = [f"{SERIES_LABEL[k]}{p[k]}" for k in ("batch_size", "num_heads", "tree_size") if k in p]
        parts += [str(v) for k, v in self.params if k not in SERIES_LABEL and k != "seed"]
        return " ".join(parts)


def line(
    xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None
) -> tuple[float, float]:
    """Weighted least-squares (intercept, slope) of ys against xs (weights default to 1); needs
    two distinct xs with positive weight."""
    w = [1.0] * len(xs) if weights is None else list(weights)
    sw = sum(w)
    if sw <= 0:
        raise ValueError("line: the weights must sum to more than 0")
    mx = sum(wi * x for wi, x in zip(w, xs, strict=True)) / sw
    my = sum(wi * y for wi, y in zip(w, ys, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs, strict=True))
    if sxx <= 0:
        raise ValueError("line: need at least two distinct x values")
    slope = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def intercept_se(
    xs: Sequence[float], ys: Sequence[float], weights: Sequence[float], fit: tuple[float, float]
) -> float:
    """Standard error of the weighted least-squares intercept of ``fit`` (its :func:`line` of the
    same points), from the residuals (n - 2 degrees of freedom; needs three or more points)."""
    n = len(xs)
    if n < 3:
        raise ValueError("intercept_se: need three or more points")
    a, b = fit
    s2 = sum(w * (y - a - b * x) ** 2 for w, x, y in zip(weights, xs, ys, strict=True)) / (n - 2)
    sw = sum(weights)
    swx = sum(w * x for w, x in zip(weights, xs, strict=True))
    swxx = sum(w * x * x for w, x in zip(weights, xs, strict=True))
    return (s2 * swxx / (sw * swxx - swx * swx)) ** 0.5


def _usable(row: SweepRow) -> bool:
    # Timed rows of whole calls: a TP rank row times one GPU's share, its step row the call.
    return row.timed and row.tp_rank is None


def _hashable(value: Any) -> Any:
    # The grids' params are numbers and strings; anything else (a list) keys by its JSON text.
    return (
        value if isinstance(value, (int, float, str, bool, type(None))) else json.dumps(value, sort_keys=True)
    )


def series_key(row: SweepRow) -> tuple:
    params = tuple(sorted((k, _hashable(v)) for k, v in row.params.items() if k != "prefix_len"))
    return (row.impl, row.mode, params)


def fit_rows(rows: Sequence[SweepRow]) -> ScalingFit | None:
    """The fit of one series' rows (same :func:`series_key`); None below MIN_PREFIXES prefixes."""
    rows = sorted((r for r in rows if _usable(r)), key=lambda r: r.params["prefix_len"])
    prefixes = tuple(sorted({int(r.params["prefix_len"]) for r in rows}))
    if len(prefixes) < MIN_PREFIXES:
        return None
    keys = {series_key(r) for r in rows}
    if len(keys) != 1:
        raise ValueError(f"fit_rows: rows of {len(keys)} series given, expected one")
    xs = [float(r.params["prefix_len"]) for r in rows]
    ys = [r.median_ms for r in rows]
    # Relative residuals: the medians span orders of magnitude and their noise is a share of
    # each, so that unweighted, the longest prefix's few-% noise would set the fixed cost.
    weights = [1.0 / y**2 for y in ys]
    fixed, rate = line(xs, ys, weights)
    fixed_se = intercept_se(xs, ys, weights, (fixed, rate))
    worst = max(abs(y - (fixed + rate * x)) / y for x, y in zip(xs, ys, strict=True))
    floor_fixed = floor_rate = None
    if all(r.floor_ms is not None and r.floor_ms > 0 for r in rows):
        floors = [r.floor_ms for r in rows]
        floor_fixed, floor_rate = line(xs, floors, [1.0 / f**2 for f in floors])
    impl, mode, params = keys.pop()
    return ScalingFit(
        impl=impl,
        mode=mode,
        params=params,
        configs=tuple(dict.fromkeys(r.impl_config for r in rows if r.impl_config)),
        prefixes=prefixes,
        points=len(rows),
        fixed_ms=fixed,
        fixed_se_ms=fixed_se,
        ms_per_key=rate,
        floor_fixed_ms=floor_fixed,
        floor_ms_per_key=floor_rate,
        worst_residual_pct=100.0 * worst,
    )


def fits(results: Results | Iterable[SweepRow]) -> list[ScalingFit]:
    """Every series' fit, in the order the series first appear in the run."""
    rows = results.sweep if isinstance(results, Results) else list(results)
    groups: dict[tuple, list[SweepRow]] = {}
    for r in rows:
        if _usable(r) and "prefix_len" in r.params:
            groups.setdefault(series_key(r), []).append(r)
    out = []
    for group in groups.values():
        f = fit_rows(group)
        if f is not None:
            out.append(f)
    return out


def prefix_text(p: int) -> str:
    """A grid's prefix length as its label: 32k for 32768 (a whole number of 1024 keys), else
    the count (200000)."""
    return f"{p // 1024}k" if p >= 1024 and p % 1024 == 0 else str(p)


def half_floor_text(f: ScalingFit) -> str:
    if not f.fixed_resolved:
        return "- (fixed cost unresolved)"
    p = f.half_floor_prefix
    if p is None:
        return "never" if f.floor_ms_per_key is not None else "-"
    if p == 0:
        return "every P"
    beyond = " (beyond the grid)" if p > f.prefixes[-1] else ""
    return f"P >= {round(p, -2):,.0f}{beyond}"


def _pct_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def records(found: Sequence[ScalingFit]) -> list[dict[str, str]]:
    """One table row of text per fit (the report's table and the CLI's)."""
    out = []
    for f in found:
        out.append(
            {
                "implementation": f.impl,
                "mode": f.mode,
                "series": f.label(),
                "config": " / ".join(f.configs) or "-",
                "prefixes": f"{prefix_text(f.prefixes[0])}-{prefix_text(f.prefixes[-1])} ({len(f.prefixes)})",
                "fixed us": f"{1000 * f.fixed_ms:.1f} ± {1000 * f.fixed_se_ms:.1f}",
                "us per 1k keys": f"{1e6 * f.ms_per_key:.3g}",
                "steady % of floor": _pct_text(f.steady_pct),
                "50 % of floor from": half_floor_text(f),
                "worst residual %": f"{f.worst_residual_pct:.1f}",
            }
        )
    return out


def text_table(found: Sequence[ScalingFit]) -> str:
    """The fits as aligned text columns (``report --scaling``)."""
    rows = records(found)
    if not rows:
        return f"no series with {MIN_PREFIXES} or more prefix lengths"
    return text_rows(rows)


@dataclass(frozen=True)
class FitChange:
    """One series' fit in two runs (``harness compare``): shown beside the verdicts, not gated."""

    base: ScalingFit
    head: ScalingFit

    @property
    def change_se_ms(self) -> float:
        """Standard error of the fixed cost's change (the two fits' errors, independent)."""
        return (self.base.fixed_se_ms**2 + self.head.fixed_se_ms**2) ** 0.5


def fit_changes(base: Iterable[SweepRow], head: Iterable[SweepRow]) -> list[FitChange]:
    """The series fitted in both runs, in HEAD's order."""
    found = {(f.impl, f.mode, f.params): f for f in fits(base)}
    out = []
    for f in fits(head):
        b = found.get((f.impl, f.mode, f.params))
        if b is not None:
            out.append(FitChange(base=b, head=f))
    return out


def change_records(changes: Sequence[FitChange]) -> list[dict[str, str]]:
    """One table row of text per series fitted in both runs (compare's terminal and HTML)."""
    return [
        {
            "implementation": c.head.impl,
            "mode": c.head.mode,
            "series": c.head.label(),
            "fixed us BASE -> HEAD": f"{1000 * c.base.fixed_ms:.1f} -> {1000 * c.head.fixed_ms:.1f}",
            "fixed change us": f"{1000 * (c.head.fixed_ms - c.base.fixed_ms):+.1f} ± {1000 * c.change_se_ms:.1f}",
            "steady % of floor BASE -> HEAD": f"{_pct_text(c.base.steady_pct)} -> {_pct_text(c.head.steady_pct)}",
            "50 % of floor from (HEAD)": half_floor_text(c.head),
        }
        for c in changes
    ]


def text_rows(rows: Sequence[dict[str, str]]) -> str:
    """Records of text (all with the same keys) as aligned columns under their keys."""
    return columns(list(rows[0]), [list(r.values()) for r in rows])
