"""One report for parity and sweep runs: ``results.json`` -> a self-contained ``index.html``.

    python -m harness report PATH [PATH ...]    re-render index.html beside each results.json
                                                (PATH: a results.json, a run folder, or a folder
                                                of run folders; a results file of another name,
                                                NAME.json, gets NAME.html beside it)
    python -m harness report --scaling PATH     print each run's fixed cost and steady rate per
                                                series of prefix lengths (harness/scaling.py)
    python -m harness report --targets PATH     print the kernel's target cases as a markdown
                                                table, and how many reach the target
                                                (harness/targets.py; --at-peak TFLOPS)
    python -m harness report --trend reports/   print, per GPU model, a line per committed run of
                                                the default grid, newest first, and each target
                                                case's newest time against its fastest earlier
                                                one (harness/trend.py; --gpu-model, --at-peak;
                                                --html FILE: also a page with a plot of them)
    python -m harness report --prune reports/   compress results.json to results.json.gz and
                                                delete index.html of every run but the newest one
                                                per GPU model, kind and grid; of those, a run on
                                                another grid loses its page to a newer run on the
                                                main grid (:func:`prune`)

The page (``harness/templates/report.html.j2``, jinja2) holds pandas tables and matplotlib plots
embedded as base64 PNG, so it opens anywhere with no other file:

* a summary, then warnings: error rows, throttled cases, unavailable implementations, notes;
* sweep: per (heads, tree size) latency and % of the roofline floor against prefix length per
  implementation, speedup bars of each implementation over each later one in the run's order,
  a table of medians per case, the fixed cost and steady rate of each series of prefix lengths
  (:mod:`harness.scaling`), and every row with its raw statistics and repro command;
* parity: real implementations, then the controls: mutation controls (``mutant:<name>`` rows)
  must fail on at least one bundle ("caught"), positive controls (``control:<name>``) must pass
  on every bundle;
* environment and the ceilings measured in the run.

Older runs keep only their results, as ``results.json.gz`` (the same text; every reader takes
either form); their HTML is regenerated from it. The newest run per GPU model, kind and grid keeps
``results.json`` plain, so that a diff between it and the next run reads row by row, and its page
unless a newer run of its GPU model and kind on the main grid holds that page.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import html
import io
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness import trend
from harness.cli import held_results, nonempty_path, positive_number
from harness.compare import RunKey, run_key, tracked_results_of_folder
from harness.results import (
    RESULTS_FILE,
    RESULTS_GZ,
    SWEEP_PARAMS_REQUIRED,
    Results,
    ResultsError,
    SweepRow,
    atomic_write_text,
    check_types,
    compress_results,
    is_results_file,
    keep_and_raise,
    kept_elsewhere,
    load_results,
    results_files_under,
    results_in,
    write_results,
)
from harness.scaling import fits, prefix_text, records, text_table
from harness.targets import (
    CAPPED_NOTE,
    DEFAULT_PEAK_TFLOPS,
    TARGET_PCT,
    any_target,
    cells,
    count_line,
    header,
    speedup_line,
    target_rows,
)
from harness.targets import IMPL as TARGET_IMPL
from harness.targets import markdown as targets_markdown

TEMPLATE = "report.html.j2"
# Parity rows of these prefixes are controls, not implementations: mutants must fail somewhere,
# positive controls (e.g. the oracle rounded to bf16) must pass everywhere.
MUTANT_PREFIX = "mutant:"
CONTROL_PREFIX = "control:"
# Beyond this many cases one bar per case no longer reads; bars become per-group summaries.
MAX_CASE_BARS = 60
FACETS_PER_FIGURE = 12
FACET_COLS = 4
PARAM_ORDER = ("num_heads", "tree_size", "batch_size", "layout", "tree", "prefix_len")
PARAM_LABEL = {"batch_size": "B", "prefix_len": "P", "num_heads": "H", "tree_size": "T"}


# ---------------------------------------------------------------------------------------------
# Formatting


def _num(value: Any, fmt: str = ".4g", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '<div class="num muted">-</div>'
    return f'<div class="num">{format(value, fmt)}{suffix}</div>'


def _directed(value: Any, fmt: str, up: bool) -> str:
    """``_num`` rounded away from a threshold's passing side: a maximum error up, a minimum
    cosine down, so that a value just past a limit never prints as the limit itself (``.2e``:
    three significant digits; ``.6f``: six decimals)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or value == 0:
        return _num(value, fmt)
    if fmt.endswith("e"):
        digits = int(fmt[1:-1])
        scale = 10.0 ** (math.floor(math.log10(abs(value))) - digits)
    else:
        scale = 10.0 ** -int(fmt[1:-1])
    steps = value / scale
    rounded = (math.ceil(steps - 1e-9) if up else math.floor(steps + 1e-9)) * scale
    return _num(rounded, fmt)


def _times(value: float) -> str:
    """A speedup as text: three decimals below 10x (an A/B's 1.004x is not 1x), else 3 digits."""
    return f"{value:.3f}x" if abs(value) < 10 else f"{value:.3g}x"


def _mpl(text: str) -> str:
    """``text`` for a matplotlib label: a pair of ``$`` would be read as a math formula."""
    return text.replace("$", r"\$")


def _text(value: Any, css: str = "") -> str:
    cls = f' class="{css}"' if css else ""
    return f"<span{cls}>{html.escape(str(value))}</span>"


def _pill(text: str, css: str) -> str:
    return f'<span class="pill {css}">{html.escape(text)}</span>'


def _bool(value: bool | None) -> str:
    if value is None:
        return _text("-", "muted")
    return _pill("yes", "good") if value else _pill("no", "bad")


# A cell that is one plain-text element whose class styles the cell as well (`.num`, `.mono`,
# `.muted` are class rules, not `span` or `div` rules): written as the cell itself.
_BARE_CELL = re.compile(r'<td><(div|span)(?: class="(num|num muted|mono|muted)")?>([^<]*)</\1></td>')


def _bare_cell(m: re.Match[str]) -> str:
    return f'<td class="{m[2]}">{m[3]}</td>' if m[2] else f"<td>{m[3]}</td>"


def _table(df: pd.DataFrame) -> str:
    """A DataFrame of already-escaped HTML cells as a table, without the indentation pandas puts
    between its tags (a tenth of a large sweep's page), and with a cell that holds one plain
    element written as a cell of that class (another tenth: the pages travel in the tree)."""
    page = re.sub(r">\n\s*<", "><", df.to_html(index=False, escape=False, border=0, classes="data"))
    return _BARE_CELL.sub(_bare_cell, page)


def _png(fig: Any) -> str:
    """The figure as a base64 PNG of 256 colours: plots hold few colours, and the palette makes
    a page's images ~3x smaller than matplotlib's RGBA (report pages travel in the tree)."""
    from PIL import Image  # matplotlib's own dependency

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, facecolor="white")
    out = io.BytesIO()
    # fast octree keeps a colour that covers few pixels (an implementation's few points), which
    # the default median cut merged into another: one implementation in two colours
    image = Image.open(buf).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    image.save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


# ---------------------------------------------------------------------------------------------
# Sweep: frames, tables, plots


# The frame's columns besides the params (sweep_frame): the row's fields of these names, and ``n``
# its sample count.
SWEEP_FRAME_FIELDS = (
    "case_id", "impl", "mode", "median_ms", "iqr_ms", "min_ms", "max_ms", "n", "floor_ms",
    "pct_of_floor", "bandwidth_gbs", "tflops", "throttled", "timed", "note", "repro", "cold_l2",
    "impl_config",
)  # fmt: skip


def sweep_frame(results: Results, include_ranks: bool = False) -> pd.DataFrame:
    """One row per sweep row (index = its position in ``results.sweep``): its fields, its params
    as columns, and ``n`` (sample count). Tensor-parallel rank rows (H/N heads on one GPU) are
    left out unless ``include_ranks``: plots and summaries show the TP step rows as the cases."""
    records, index = [], []
    for i, r in enumerate(results.sweep):
        if r.tp_rank is not None and not include_ranks:
            continue
        index.append(i)
        rec = {k: len(r.samples_ms) if k == "n" else getattr(r, k) for k in SWEEP_FRAME_FIELDS}
        rec.update({k: v for k, v in r.params.items() if k not in rec})
        records.append(rec)
    if not records:  # e.g. a TP run of rank rows only: the columns still exist, with no rows
        return pd.DataFrame(columns=[*SWEEP_FRAME_FIELDS, *SWEEP_PARAMS_REQUIRED])
    return pd.DataFrame.from_records(records, index=index)


def impl_order(results: Results) -> list[str]:
    """Implementations in the order the run wrote them (the registry's order)."""
    return list(dict.fromkeys(r.impl for r in results.sweep))


def _case_sort_key(params: dict[str, Any]) -> tuple:
    return tuple(
        str(params.get(k, "")) if isinstance(params.get(k), str) else params.get(k, 0) for k in PARAM_ORDER
    )


def case_order(results: Results) -> list[str]:
    """Case ids sorted by heads, tree size, batch, layout, tree kind, then prefix length."""
    params = {r.case_id: r.params for r in results.sweep}
    return sorted(params, key=lambda c: _case_sort_key(params[c]))


def facet_keys(results: Results) -> list[str]:
    """The params that split the plots into panels: heads and tree size, plus batch size,
    layout and tree kind when they vary in the run (prefix length is the x axis)."""
    keys = ["num_heads", "tree_size"]
    for k in ("batch_size", "layout", "tree"):
        if len({str(r.params.get(k)) for r in results.sweep}) > 1:
            keys.append(k)
    return keys


def _facet_title(key: tuple, names: Sequence[str]) -> str:
    return " ".join(
        f"{PARAM_LABEL[n]}{v}" if n in PARAM_LABEL else str(v) for n, v in zip(names, key, strict=True)
    )


def _facets(df: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    return [(k if isinstance(k, tuple) else (k,), g) for k, g in df.groupby(keys, sort=True)]


def _figure(n_panels: int) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    cols = min(FACET_COLS, n_panels)
    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(3.6 * cols, 2.9 * rows + 0.5), dpi=90, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).flatten().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _colors(impls: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(impls)}


def _prefix_axis(ax: Any, prefixes: Iterable[int]) -> None:
    ticks = sorted({int(p) for p in prefixes if p > 0})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [prefix_text(p) for p in ticks])
    ax.minorticks_off()
    ax.tick_params(axis="x", labelrotation=45)  # 128k, 200000 and 256k sit close on a log axis
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("prefix length")


def _log_axis(axis: Any, values: pd.Series) -> None:
    """Log scale with plain numbers; within one decade the minor ticks are labelled too, since
    no major tick may fall inside it."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    if axis.axis_name == "y":
        axis.axes.set_yscale("log")
    else:
        axis.axes.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    lo, hi = float(values.min()), float(values.max())
    axis.set_minor_formatter(plain if lo > 0 and hi / lo < 10 else NullFormatter())


# The legend entry of a ring around a point whose row NVML reported throttled (the power cap).
THROTTLED_LABEL = "throttled (ring)"


def prefix_plots(
    results: Results, value: str, ylabel: str, *, modes: Sequence[str], log_y: bool
) -> list[str]:
    """PNG figures (base64): ``value`` against prefix length per implementation (and mode),
    one panel per facet, at most FACETS_PER_FIGURE panels per figure."""
    df = sweep_frame(results)
    df = df[df["timed"] & df["mode"].isin(modes) & df[value].notna() & (df["prefix_len"] > 0)]
    if df.empty:
        return []
    impls = impl_order(results)
    colors = _colors(impls)
    keys = facet_keys(results)
    # A facet measured at one prefix length has no line to draw (its times are in the tables).
    facets = [(k, g) for k, g in _facets(df, keys) if g["prefix_len"].nunique() > 1]
    images = []
    for start in range(0, len(facets), FACETS_PER_FIGURE):
        chunk = facets[start : start + FACETS_PER_FIGURE]
        fig, axes = _figure(len(chunk))
        for ax, (key, g) in zip(axes, chunk, strict=True):
            for impl in impls:
                for mode in modes:
                    line = g[(g["impl"] == impl) & (g["mode"] == mode)].sort_values("prefix_len")
                    if line.empty:
                        continue
                    ax.plot(
                        line["prefix_len"],
                        line[value],
                        marker="o",
                        markersize=3.5,
                        linestyle="-" if mode == modes[0] else "--",
                        color=colors[impl],
                        label=_mpl(impl if len(modes) == 1 else f"{impl} ({mode})"),
                    )
                    capped = line[line["throttled"].astype(bool)]
                    if not capped.empty:  # the rows' tables flag them too
                        ax.plot(
                            capped["prefix_len"],
                            capped[value],
                            linestyle="none",
                            marker="o",
                            markersize=8,
                            markerfacecolor="none",
                            markeredgecolor="#c0392b",
                            label=THROTTLED_LABEL,
                        )
            _prefix_axis(ax, g["prefix_len"])
            if log_y:
                _log_axis(ax.yaxis, g[value])
            ax.set_title(_facet_title(key, keys), fontsize=10)
            ax.set_ylabel(ylabel)
            ax.tick_params(labelsize=8)
        handles, labels = {}, []
        for ax in axes:
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                if lab not in handles:
                    handles[lab] = h
                    labels.append(lab)
        fig.legend(
            [handles[lab] for lab in labels],
            labels,
            loc="outside upper center",
            ncols=min(len(labels), 4),
            fontsize=9,
        )
        images.append(_png(fig))
    return images


def speedup_plots(results: Results, mode: str = "cold") -> list[dict[str, str]]:
    """Per implementation X that is not first in the run's order: bars of the speedup of each
    earlier implementation over X (median X / median other), per case or, for many cases, as the
    geometric mean per facet with its min..max."""
    impls = impl_order(results)
    order = {c: i for i, c in enumerate(case_order(results))}
    by_case = {(r.case_id, r.impl): r for r in results.sweep if r.mode == mode and r.timed}
    keys = facet_keys(results)
    out = []
    colors = _colors(impls)
    for j, over in enumerate(impls):
        pairs = {}
        for impl in impls[:j]:
            vals = {
                cid: r.speedup[over]
                for (cid, name), r in by_case.items()
                if name == impl and over in r.speedup and (cid, over) in by_case
            }
            if vals:
                pairs[impl] = vals
        if not pairs:
            continue
        cases = sorted({c for v in pairs.values() for c in v}, key=order.__getitem__)
        params = {r.case_id: r.params for r in results.sweep}
        if len(cases) <= MAX_CASE_BARS:
            labels = cases
            series = {impl: [(v.get(c), None, None) for c in cases] for impl, v in pairs.items()}
            caption = f"speedup over {over} per case ({mode}); > 1: faster than {over}"
        else:
            groups: dict[str, list[str]] = {}
            for c in cases:
                groups.setdefault(_facet_title(tuple(params[c].get(k) for k in keys), keys), []).append(c)
            labels = list(groups)
            series = {}
            for impl, v in pairs.items():
                series[impl] = []
                for g in labels:
                    xs = [v[c] for c in groups[g] if c in v]
                    series[impl].append(
                        (math.exp(sum(map(math.log, xs)) / len(xs)), min(xs), max(xs))
                        if xs
                        else (None, None, None)
                    )
            caption = (
                f"speedup over {over} ({mode}), geometric mean over prefix lengths per group with min..max; "
                f"> 1: faster than {over}"
            )
        out.append({"over": over, "caption": caption, "png": _bars(labels, series, colors, over)})
    return out


def _bars(labels: list[str], series: dict[str, list[tuple]], colors: dict[str, Any], over: str) -> str:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    n, k = len(labels), len(series)
    height = 0.8 / k
    fig = Figure(figsize=(9.5, 0.9 + 0.26 * n * max(k, 1)), dpi=90, layout="constrained")
    ax = fig.subplots()
    for i, (impl, vals) in enumerate(series.items()):
        ys = [y + (i - (k - 1) / 2) * height for y in range(n)]
        mids = [v[0] if v[0] is not None else math.nan for v in vals]
        # bars grow from 1x: right of the line is faster than `over`, left is slower
        ax.barh(
            ys,
            [m - 1.0 for m in mids],
            left=1.0,
            height=height * 0.92,
            color=colors[impl],
            label=_mpl(f"{impl} over {over}"),
        )
        for y, (mid, lo, hi) in zip(ys, vals, strict=True):
            if mid is None:
                continue
            if lo is not None:
                ax.plot([lo, hi], [y, y], color="#333333", linewidth=1)
            ax.annotate(
                _times(mid),
                (max(mid, hi or mid), y),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7.5,
            )
    ax.axvline(1.0, color="#333333", linewidth=1)
    finite = [x for vals in series.values() for v in vals for x in v if x is not None]
    _log_axis(ax.xaxis, pd.Series(finite + [1.0]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    if isinstance(ax.xaxis.get_minor_formatter(), FuncFormatter):  # labelled within one decade
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"speedup: median {over} / median of the implementation")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    fig.legend(loc="outside upper left", fontsize=8, ncols=len(series))
    ax.margins(x=0.12)
    return _png(fig)


def summary_table(results: Results, mode: str) -> str:
    """Per case: each implementation's median (ms) over its % of floor, then the speedups of the
    first implementation in the run's order over each of the others."""
    impls = impl_order(results)
    rows = {r.case_id: {} for r in results.sweep if r.mode == mode}
    for r in results.sweep:
        if r.mode == mode:
            rows[r.case_id][r.impl] = r
    if not rows:
        return ""
    records = []
    for cid in [c for c in case_order(results) if c in rows]:
        got = rows[cid]
        rec = {"case": _text(cid, "mono")}
        for impl in impls:
            r = got.get(impl)
            column = html.escape(impl)
            if r is None:
                rec[column] = _num(None)
            elif not r.timed:
                rec[column] = f'<div class="num">{_pill("error", "bad")}</div>'
            else:
                floor = "" if r.pct_of_floor is None else f"{r.pct_of_floor:.3g} % of floor"
                flag = throttle_pill(r)
                rec[column] = (
                    f'<div class="num">{flag}{r.median_ms:.4g} ms</div><div class="num small">{floor}</div>'
                )
        lead = got.get(impls[0])
        for other in impls[1:]:
            value = lead.speedup.get(other) if lead is not None and lead.timed else None
            rec[f"{html.escape(impls[0])}<br>over {html.escape(other)}"] = (
                _num(None) if value is None else f'<div class="num">{_times(value)}</div>'
            )
        records.append(rec)
    return _table(pd.DataFrame.from_records(records))


def scaling_table(results: Results) -> str:
    """Per series of prefix lengths: the fitted fixed cost and steady rate (:mod:`harness.scaling`)."""
    rows = records(fits(results))
    if not rows:
        return ""
    cells = [
        {html.escape(k): _text(v, "mono" if k == "series" else "") for k, v in row.items()} for row in rows
    ]
    return _table(pd.DataFrame.from_records(cells))


def targets_section(results: Results, peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> dict[str, str]:
    """The target cases' table (:mod:`harness.targets`) and its two lines; empty where the run
    timed the kernel on none of them."""
    rows = target_rows(results, peak_tflops) if results.sweep else []
    if not any_target(rows):
        return {"table": "", "count": "", "speedup": "", "peak": f"{peak_tflops:g}"}
    records = []
    for t in rows:
        rec = {}
        for name, (text, hit) in zip(header(peak_tflops), cells(t), strict=True):
            cell = html.escape(text)
            rec[html.escape(name)] = f"<b>{cell}</b>" if hit else cell
        records.append(rec)
    return {
        "table": _table(pd.DataFrame.from_records(records)),
        "count": f"{count_line(results, rows, peak_tflops)} {CAPPED_NOTE}",
        "speedup": speedup_line(rows),
        "peak": f"{peak_tflops:g}",
    }


def _nvml_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """SM clock (MHz) and temperature (°C) from before the row to after it: ``1980→1755, 52→71``."""
    if not before or not after:
        return "-"
    return "{}→{}, {}→{}".format(
        before.get("sm_clock_mhz", "?"),
        after.get("sm_clock_mhz", "?"),
        before.get("temperature_c", "?"),
        after.get("temperature_c", "?"),
    )


def throttle_pill(r: SweepRow) -> str:
    """The row's throttle pill ("" when not throttled), with how many of its samples NVML's
    readings around them show capped where they were read per sample: ``throttled, 12/65
    samples`` (``0/65``: the row's snapshots alone saw a cap)."""
    if not r.throttled:
        return ""
    counted = "" if r.capped_count is None else f", {r.capped_count} samples"
    return _pill(f"throttled{counted}", "warn") + " "


def rows_table(results: Results) -> str:
    """Every sweep row: what the implementation ran (its config, where it says), statistics,
    throughput, floor, cold-L2 method, NVML clocks and temperature before -> after, note, repro
    command."""
    df = sweep_frame(results, include_ranks=True)
    if df.empty:
        return ""
    order = {c: i for i, c in enumerate(case_order(results))}
    impls = {n: i for i, n in enumerate(impl_order(results))}
    df = df.assign(_c=df["case_id"].map(order), _i=df["impl"].map(impls)).sort_values(["_c", "_i", "mode"])
    rows = [results.sweep[i] for i in df.index]
    out = pd.DataFrame(
        {
            "case": [_text(c, "mono") for c in df["case_id"]],
            "implementation": [_text(i, "mono") for i in df["impl"]],
            "config": [_text(c or "-", "mono small") for c in df["impl_config"]],
            "mode": [_text(m) for m in df["mode"]],
            "n": [_num(n, "d") for n in df["n"]],
            "median ms": [
                _num(v) if t else _pill("error", "bad")
                for v, t in zip(df["median_ms"], df["timed"], strict=True)
            ],
            "IQR %": [
                _num(100 * q / m if t else None, ".2g", " %")
                for q, m, t in zip(df["iqr_ms"], df["median_ms"], df["timed"], strict=True)
            ],
            "min ms": [_num(v if t else None) for v, t in zip(df["min_ms"], df["timed"], strict=True)],
            "max ms": [_num(v if t else None) for v, t in zip(df["max_ms"], df["timed"], strict=True)],
            "GB/s": [_num(v, ".4g") for v in df["bandwidth_gbs"]],
            "TFLOP/s": [_num(v, ".3g") for v in df["tflops"]],
            "floor ms": [_num(v) for v in df["floor_ms"]],
            "% floor": [_num(v, ".3g", " %") for v in df["pct_of_floor"]],
            "cold L2": [_text(v or "-", "small nowrap") for v in df["cold_l2"]],
            "SM MHz, °C": [_text(_nvml_change(r.nvml_before, r.nvml_after), "small nowrap") for r in rows],
            "note": [throttle_pill(r) + _text(r.note, "small") for r in rows],
            "repro": [f'<code class="nowrap">{html.escape(r)}</code>' for r in df["repro"]],
        }
    )
    if len({r.gpu_index for r in rows}) > 1:  # a run over several GPUs: which one timed the row
        out.insert(
            4, "GPU", [_num(r.gpu_index, "d") if r.gpu_index is not None else _num(None) for r in rows]
        )
    return _table(out)


# ---------------------------------------------------------------------------------------------
# Parity


def is_control(impl: str) -> bool:
    return impl.startswith((MUTANT_PREFIX, CONTROL_PREFIX))


def parity_tables(results: Results) -> dict[str, Any]:
    """``real``: rows of real implementations; ``controls``: one row per control with the
    bundles it failed and did not fail on; ``controls_broken``: the controls that did not behave
    as expected (a mutant that never fails, a positive control that fails somewhere)."""
    real = [p for p in results.parity if not is_control(p.impl)]
    controls = [p for p in results.parity if is_control(p.impl)]
    status_css = {"pass": "good", "fail": "bad", "error": "bad", "unavailable": "muted"}
    out: dict[str, Any] = {"real": "", "controls": "", "controls_broken": []}
    if real:
        df = pd.DataFrame(
            {
                "bundle": [_text(p.bundle, "mono") for p in real],
                "implementation": [_text(p.impl, "mono") for p in real],
                "status": [_pill(p.status, status_css.get(p.status, "muted")) for p in real],
                "max rel err": [_directed(p.max_rel_err, ".2e", up=True) for p in real],
                "min cosine": [_directed(p.min_cosine, ".6f", up=False) for p in real],
                "max lse err": [_directed(p.max_lse_abs_err, ".2e", up=True) for p in real],
                "tokens": [_bool(p.tokens_match) for p in real],
                "path": [_bool(p.path_match) for p in real],
                "rows": [_num(p.num_rows or None, "d") for p in real],
                "worst row": [_text(p.worst_row or "-", "small nowrap") for p in real],
                "time s": [_num(p.run_time_s, ".3g") for p in real],
                "reason": [_text(p.reason, "small") for p in real],
            }
        )
        out["real"] = _table(df)
    if controls:
        names = sorted(dict.fromkeys(p.impl for p in controls), key=lambda n: n.startswith(MUTANT_PREFIX))
        records = []
        for name in names:
            rows = [p for p in controls if p.impl == name]
            failed = [p.bundle for p in rows if p.status == "fail"]
            other = [f"{p.bundle} ({p.status})" for p in rows if p.status != "fail"]
            if name.startswith(MUTANT_PREFIX):
                ok = bool(failed)
                expected, result = "fail on at least one bundle", "caught" if ok else "NOT CAUGHT"
            else:
                ok = all(p.status == "pass" for p in rows)
                expected, result = "pass on every bundle", "holds" if ok else "FAILED"
            if not ok:
                out["controls_broken"].append(name)
            records.append(
                {
                    "control": _text(name, "mono"),
                    "expected": _text(expected, "nowrap"),
                    "result": _pill(result, "good" if ok else "bad"),
                    "failed on": _text(", ".join(failed) or "-", "small"),
                    "did not fail on": _text(", ".join(other) or "-", "small"),
                }
            )
        out["controls"] = _table(pd.DataFrame.from_records(records))
    return out


# ---------------------------------------------------------------------------------------------
# Environment


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(d, dict) and d:
        out = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(d, list):
        return [(prefix, ", ".join(map(str, d)) or "-")]
    return [(prefix, "-" if d is None or d == {} or d == "" else str(d))]


def kv_table(d: dict[str, Any] | None) -> str:
    if not d:
        return ""
    df = pd.DataFrame(
        {
            "field": [_text(k, "mono") for k, _ in _flatten(d)],
            "value": [_text(v, "mono") for _, v in _flatten(d)],
        }
    )
    return _table(df)


def _empty_kernel_us(ceilings: dict[str, Any]) -> float | None:
    ms = ceilings.get("empty_kernel_ms")
    return ms * 1000.0 if ms else None


def ceilings_table(ceilings: dict[str, Any] | None) -> str:
    if not ceilings:
        return ""
    rows = [
        ("copy bandwidth", _num(ceilings.get("copy_bandwidth_gbs"), ".4g", " GB/s")),
        ("bf16 tensor peak", _num(ceilings.get("bf16_tflops"), ".4g", " TFLOP/s")),
        # the timing's own floor (no floor uses it); runs before it was measured show "-"
        ("empty kernel between the events", _num(_empty_kernel_us(ceilings), ".3g", " us")),
        ("method", _text(ceilings.get("method", "-"), "small")),
    ]
    return _table(pd.DataFrame({"ceiling": [_text(k) for k, _ in rows], "value": [v for _, v in rows]}))


# ---------------------------------------------------------------------------------------------
# The page


def _title(results: Results) -> str:
    gpu = (results.environment.get("gpu") or {}).get("name") or "CPU only"
    return f"verify-attention {results.kind} on {gpu}"


def _git_text(git: dict[str, Any]) -> str:
    sha = git.get("sha")
    if not sha:
        return "not a git checkout"
    return f"{str(sha)[:12]}{' (dirty)' if git.get('dirty') else ''}"


def _why_untimed(row: SweepRow) -> str:
    """Why a row has nothing to show: its note, or what its samples say."""
    if row.note:
        return row.note
    if row.status != "ok":
        return row.status
    if not row.samples_ms:
        return "no samples"
    return f"a median of {row.median_ms:g} ms: nothing to divide by"


def _steps_only(results: Results) -> Results:
    """``results`` without tensor-parallel rank rows (H/N heads on one GPU): the cases a summary,
    a speedup bar or a count of cases shows are the TP steps (the rows table keeps every rank)."""
    if all(r.tp_rank is None for r in results.sweep):
        return results
    return dataclasses.replace(results, sweep=[r for r in results.sweep if r.tp_rank is None])


def context(results: Results) -> dict[str, Any]:
    """Everything the template shows, already formatted."""
    from markupsafe import Markup

    steps = _steps_only(results)
    sweep = results.sweep
    # the mode the floor and speedup figures show: cold, or the run's one mode where it has no cold
    main_mode = "cold" if any(r.mode == "cold" for r in sweep) or not sweep else sweep[0].mode
    errors = [r for r in sweep if not r.timed]
    throttled = [r for r in sweep if r.throttled]
    modes = list(dict.fromkeys(r.mode for r in sweep))
    parity = parity_tables(results)
    real_parity = [p for p in results.parity if not is_control(p.impl)]
    summary = []
    if sweep:
        ranks = len(sweep) - len(steps.sweep)
        summary.append(
            f"{len({r.case_id for r in steps.sweep})} cases, {len(impl_order(results))} implementations, "
            f"{len(sweep)} rows" + (f" ({ranks} of them tensor-parallel ranks' own)" if ranks else "")
        )
    if real_parity:
        counts: dict[str, int] = {}
        for p in real_parity:
            counts[p.status] = counts.get(p.status, 0) + 1
        summary.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    controls = {p.impl for p in results.parity if is_control(p.impl)}
    if controls:
        summary.append(
            f"controls: {len(controls) - len(parity['controls_broken'])} of {len(controls)} as expected"
        )
    return {
        "title": _title(results),
        "results": results,
        "git": _git_text(results.git),
        "summary": summary,
        "errors": [
            {"case": r.case_id, "impl": r.impl, "mode": r.mode, "why": _why_untimed(r)} for r in errors
        ],
        "throttled": [
            {"case": r.case_id, "impl": r.impl, "mode": r.mode, "reasons": ", ".join(r.throttle_reasons)}
            for r in throttled
        ],
        "parity_failures": [p for p in real_parity if p.status in ("fail", "error")],
        "controls_broken": parity["controls_broken"],
        "parity_real": Markup(parity["real"]),
        "parity_controls": Markup(parity["controls"]),
        "summary_tables": [
            {"mode": m, "html": Markup(summary_table(steps, m))} for m in modes if summary_table(steps, m)
        ],
        "latency_plots": prefix_plots(results, "median_ms", "median ms", modes=modes, log_y=True)
        if sweep
        else [],
        "floor_plots": prefix_plots(results, "pct_of_floor", "% of floor", modes=[main_mode], log_y=False)
        if sweep
        else [],
        "speedup_plots": speedup_plots(steps, main_mode) if sweep else [],
        "scaling_table": Markup(scaling_table(results)),
        "targets": {k: Markup(v) if k == "table" else v for k, v in targets_section(results).items()},
        "empty_kernel_us": _empty_kernel_us(results.ceilings or {}),
        "rows_table": Markup(rows_table(results)),
        "environment": Markup(kv_table(results.environment)),
        "git_table": Markup(kv_table(results.git)),
        "ceilings": Markup(ceilings_table(results.ceilings)),
        "modes": modes,
        "n_cases": len({r.case_id for r in steps.sweep}),
        # a long table would bury everything below it: open only when it is short
        "summary_open": len({r.case_id for r in steps.sweep}) <= MAX_CASE_BARS,
    }


def render_html(results: Results, source: str = "results.json") -> str:
    """The report page for ``results`` (``source`` names the file in errors). Results built in
    memory get the type checks that reading a file does, so :func:`write_run` never writes a
    results.json that the tools cannot read back."""
    check_types(results.to_json(), source)
    return _template(TEMPLATE).render(**context(results))


def _template(name: str) -> Any:
    """A page template of ``harness/templates``, escaping what it is given unless marked safe."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template(name)


UNSHOWN_FILE = "results.unshown.json"


def write_run(results: Results, out_dir: Path) -> Path:
    """Write ``index.html`` and then ``results.json`` into ``out_dir``; returns out_dir.

    - The page is rendered before anything is written, so a results set that cannot be shown
      leaves no run folder behind, only its results as ``results.unshown.json`` (and a
      ResultsError naming the field).
    - Both files are written whole and never over a file already there: a folder that holds a
      run's results or a page (another run writing there at the same time, a run cut short, a
      page of the user's) is left as it was.
    - ``results.json``, the file every tool keys a run on, is written last, so a run cut short
      between the two leaves a page and no results (a folder no tool reads), never results
      without their page.
    - Whatever else stops the write (the folder, a render that fails otherwise, Ctrl-C), the
      results are kept in a folder of their own under the system's temporary directory and the
      error (for Ctrl-C, a line on stderr) says where: a report that cannot be written never
      costs the measurements.
    """
    out_dir = Path(out_dir)
    held = held_results(out_dir) if out_dir.is_dir() else None
    if held is not None:  # the commands refuse such an --out before the run; it may have appeared since
        raise ResultsError(
            kept_elsewhere(results, f"{out_dir}: already holds a run ({held.name}), left as it was")
        )
    try:
        page = render_html(results, str(out_dir / RESULTS_FILE))
    except ResultsError as e:
        # A run whose results cannot be shown (a field of the wrong type: a bug where they were
        # made) is still the user's measurements: kept under a name no tool takes for a run.
        kept = out_dir / UNSHOWN_FILE
        write_results(results, kept)
        raise ResultsError(f"{e}; the results are kept in {kept}, which no tool reads as a run") from e
    except BaseException as e:
        keep_and_raise(results, e, f"{out_dir}: the page could not be rendered")
    page_path = out_dir / "index.html"
    try:
        atomic_write_text(page_path, page, exclusive=True)
    except FileExistsError as e:
        raise ResultsError(
            kept_elsewhere(
                results,
                f"{out_dir}: already holds an index.html (another run writing there, a run cut short, "
                "or a page of its own), left as it was",
            )
        ) from e
    except BaseException as e:
        keep_and_raise(results, e, f"{out_dir}: cannot write the run there")
    try:
        write_results(results, out_dir / RESULTS_FILE, exclusive=True)
    except BaseException as e:
        page_path.unlink(missing_ok=True)  # ours, written just now: a page without its results
        keep_and_raise(results, e, f"{out_dir}: cannot write the run there")
    return out_dir


def page_of(json_path: Path) -> Path:
    """The page re-rendered from a results file: a run's ``index.html`` beside its
    ``results.json`` (or ``results.json.gz``); for a results file of another name, a page named
    after it (``run-a.json`` -> ``run-a.html``), so that two such files in one folder, or a page of
    the folder's own, are not written over."""
    json_path = Path(json_path)
    if is_results_file(json_path):
        return json_path.parent / "index.html"
    return json_path.with_name(f"{json_path.name.removesuffix('.gz').removesuffix('.json')}.html")


def rerender(path: Path) -> Path:
    """Regenerate the page of a results file (or a run folder's, its index.html: see
    :func:`page_of`); returns the page's path."""
    path = Path(path)
    json_path = results_in(path) if path.is_dir() else path
    results = load_results(json_path)
    page = page_of(json_path)
    atomic_write_text(page, render_html(results, str(json_path)))
    return page


def _run_files(root: Path) -> list[Path]:
    """The results files (plain or compressed) of ``root``: itself, its run folder's, or every
    one below it. ResultsError when ``root`` does not exist or cannot be listed."""
    root = Path(root)
    if not root.exists():
        raise ResultsError(f"{root}: no such file or folder")
    if root.is_file():
        return [root]
    try:
        if any(is_results_file(p) for p in root.iterdir()):
            return [results_in(root)]
        return results_files_under(root)
    except OSError as e:
        raise ResultsError(f"{root}: cannot list the folder: {e.strerror or e}") from e


# The grid whose newest run of a GPU model and kind stands for that model and kind's pages: the
# default sweep, and parity on every bundle with the mutation controls (a narrowed run's grid
# carries its brackets, harness.compare.run_grid). Other kinds (A/B runs) have none: each grid
# of theirs is an experiment of its own and keeps its newest page.
MAIN_GRIDS = {"sweep": "default", "parity": "all-bundles"}


def prune(root: Path) -> tuple[list[Path], list[str], list[str]]:
    """Compress the ``results.json`` of every run under ``root`` but the newest per (GPU model,
    kind, grid), the key the history gate groups runs by (:func:`harness.compare.run_key`), to
    ``results.json.gz``, and delete those runs' index.html.

    Of the newest runs, a sweep or parity run on another grid than the main one
    (:data:`MAIN_GRIDS`: a quick sweep, a tensor-parallel one, a narrowed one) loses its page,
    not its plain results, once a run of the same GPU model and kind on the main grid is newer:
    DESIGN.md keeps the HTML of a GPU model's latest run. A quick or tensor-parallel sweep made
    after the default grid's run keeps its page and leaves the default run's page alone; A/B
    runs keep the newest page of each of their grids.

    Only the runs the history gate reads count (:func:`harness.compare.tracked_results`: those
    git tracks or would track): a run in a git-ignored scratch folder neither takes the newest
    page from a committed run nor is pruned itself.

    Returns (deleted pages and compressed files, warnings about results files that could not be
    read, which are left alone, and one line per run that could not be pruned: its folder and the
    OS error; the other runs are pruned all the same). ResultsError when ``root`` does not exist.
    """
    files = tracked_results_of_folder(root, "--prune")
    newest: dict[RunKey, tuple[str, Path]] = {}
    main_newest: dict[tuple[str, str], str] = {}  # (GPU model, kind) -> its main grid's newest run's time
    runs: list[tuple[RunKey, Path]] = []
    warnings = []
    for json_path in files:
        try:
            results = load_results(json_path)
        except ResultsError as e:
            warnings.append(str(e))
            continue
        key = run_key(results)
        runs.append((key, json_path))
        if key not in newest or results.created_utc > newest[key][0]:
            newest[key] = (results.created_utc, json_path.parent)
        model_kind = (key.gpu_model, key.kind)
        if MAIN_GRIDS.get(key.kind) == key.grid and results.created_utc > main_newest.get(model_kind, ""):
            main_newest[model_kind] = results.created_utc
    changed, failures = [], []
    for key, json_path in runs:
        created, folder = newest[key]
        is_newest = json_path.parent == folder
        main = MAIN_GRIDS.get(key.kind)
        superseded = (
            main is not None and key.grid != main and main_newest.get((key.gpu_model, key.kind), "") > created
        )
        if is_newest and not superseded:
            continue
        page = json_path.parent / "index.html"
        try:
            if page.is_file():
                page.unlink()
                changed.append(page)
            if not is_newest and json_path.name == RESULTS_FILE:
                changed.append(compress_results(json_path))
        except OSError as e:
            failures.append(f"{json_path.parent}: {e.strerror or e}")
    return changed, warnings, failures


def _main_prune(root: Path) -> int:
    try:
        changed, warnings, failures = prune(root)
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"warning: {w} (left alone)", file=sys.stderr)
    pages = [p for p in changed if p.name == "index.html"]
    for path in changed:
        print(f"deleted {path}" if path.name == "index.html" else f"compressed {path}")
    for f in failures:
        print(f"error: could not prune {f}", file=sys.stderr)
    print(
        f"{len(pages)} page(s) deleted, {len(changed) - len(pages)} results file(s) compressed; "
        "the newest run per GPU model, kind and grid keeps its plain results.json, and its index.html "
        "unless a newer run of that GPU model and kind on the main grid took the page"
    )
    if failures:
        print(f"error: {len(failures)} run(s) could not be pruned (listed above)", file=sys.stderr)
        return 2
    return 0


def _print_each_run(
    paths: Sequence[str],
    show: Callable[[Path, Results], str],
    wanted: Callable[[Results], bool] = lambda results: True,
) -> int:
    """``show(path, results)`` printed for every results file under ``paths``; 2 when a path
    holds none or a file cannot be read (named on stderr), else 0. A run found below a folder of
    runs that is not ``wanted`` (a parity run where sweeps are shown) is passed over; one named
    itself is shown, and ``show`` says what is wrong with it."""
    status = 0
    for root in paths:
        try:
            files = _run_files(Path(root))
            if not files:
                raise ResultsError(f"{root}: no results.json (or results.json.gz) found")
        except ResultsError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
            continue
        named = Path(root).resolve()
        for json_path in files:
            try:
                results = load_results(json_path)
                if named in (json_path.resolve(), json_path.parent.resolve()) or wanted(results):
                    print(show(json_path, results))
            except ResultsError as e:
                print(f"error: {e}", file=sys.stderr)
                status = 2
    return status


def _main_scaling(paths: Sequence[str]) -> int:
    return _print_each_run(paths, lambda path, results: f"{path}:\n{text_table(fits(results))}")


def _main_targets(paths: Sequence[str], peak_tflops: float) -> int:
    def show(path: Path, results: Results) -> str:
        if not results.sweep:  # nothing a --targets table could come from: the wrong run given
            raise ResultsError(f"{path}: no sweep rows (a {results.kind} run); --targets expects a sweep run")
        rows = target_rows(results, peak_tflops)
        if not any_target(rows):
            return (
                f"{path}: the run has no row of {TARGET_IMPL} on a target case on one GPU (another grid, "
                "other implementations, or a TP run); no targets to show\n"
            )
        return f"{path}:\n\n{targets_markdown(results, peak_tflops, rows)}\n"

    return _print_each_run(paths, show, wanted=lambda results: bool(results.sweep))


# ---------------------------------------------------------------------------------------------
# The trend over the committed runs (harness/trend.py): its page

TREND_TEMPLATE = "trend.html.j2"
TREND_OTHER_COLOR = "#b9c2cc"


def trend_plot(runs: Sequence[trend.TrendRun], peak_tflops: float) -> str:
    """Each target case's % of the floor at ``peak_tflops`` over ``runs`` (given newest first,
    drawn oldest first, a run a tick): the H=8 T=16 cases of the table in colour, the others
    grey, the target's line dashed. A base64 PNG."""
    from matplotlib.figure import Figure

    ordered = list(reversed(runs))
    series = trend.pct_at_peak_series(ordered)
    named = [trend.case_name(c) for c in (*trend.SHOWN_CASES, trend.SPEEDUP_CASE)]
    fig = Figure(figsize=(max(6.0, 3.0 + 0.2 * len(ordered)), 4.2), dpi=90, layout="constrained")
    ax = fig.subplots()
    x = list(range(len(ordered)))

    def ys(values: list[float | None]) -> list[float]:
        return [math.nan if v is None else v for v in values]

    others = [name for name in series if name not in named]
    for i, name in enumerate(others):
        label = f"the other {len(others)} target cases" if i == 0 else None
        ax.plot(x, ys(series[name]), color=TREND_OTHER_COLOR, lw=0.8, label=label)
    colors = _colors(named)
    for name in named:
        if name in series:
            ax.plot(x, ys(series[name]), color=colors[name], lw=1.6, marker="o", ms=3, label=name)
    ax.axhline(TARGET_PCT, color="#b3261e", lw=1.0, ls="--", label=f"{TARGET_PCT:g} % of the floor")
    ax.set_xticks(x, [r.sha7 for r in ordered], rotation=90, fontsize=7)
    ax.set_xlim(-0.5, len(ordered) - 0.5)
    ax.set_ylabel(f"% of the floor at {peak_tflops:g} TFLOP/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def _text_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows of plain text as an HTML table, each cell escaped."""
    frame = pd.DataFrame(
        [[html.escape(c) for c in row] for row in rows], columns=[html.escape(h) for h in head]
    )
    return _table(frame)


def trend_page(groups: dict[str, list[trend.TrendRun]], peak_tflops: float, source: str) -> str:
    """The trend of each GPU model of ``groups`` (:func:`harness.trend.groups_of`) as a
    self-contained page: a plot of every target case over the runs, the runs' table and each
    case's newest time against its fastest earlier one. ``source`` names the reports folder."""
    from markupsafe import Markup

    models = []
    for model, runs in groups.items():
        best_head, best = trend.best_rows(runs)
        models.append(
            {
                "title": trend.title(model, runs),
                "plot": trend_plot(runs, peak_tflops),
                "runs": Markup(
                    _text_table(trend.header(peak_tflops), [trend.run_cells(r, peak_tflops) for r in runs])
                ),
                "best": Markup(_text_table(best_head, best)) if best else None,
            }
        )
    return _template(TREND_TEMPLATE).render(
        models=models, source=source, peak=f"{peak_tflops:g}", best_note=trend.BEST_NOTE, doc=trend.PAGE_NOTE
    )


def _main_trend(args: argparse.Namespace, peak_tflops: float) -> int:
    root, html_path = Path(args.trend), args.html
    try:
        groups = trend.groups_of(root, peak_tflops, args.gpu_model, args.grid, args.impl)
        print(trend.markdown(groups, peak_tflops))
        if html_path is not None:
            atomic_write_text(html_path, trend_page(groups, peak_tflops, str(root)))
            print(f"wrote {html_path}")
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --html {html_path}: cannot write the page there: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


def main(args: argparse.Namespace) -> int:
    commands = [
        name
        for name, given in (
            ("--prune", args.prune),
            ("--scaling", args.scaling),
            ("--targets", args.targets),
            ("--trend", args.trend),
        )
        if given
    ]
    if len(commands) > 1:
        print(f"error: {' and '.join(commands)} are separate commands; give one", file=sys.stderr)
        return 2
    if args.trend == "":
        print(
            "error: --trend is empty; expected the reports folder (an empty path would mean the current folder)",
            file=sys.stderr,
        )
        return 2
    if "" in (args.paths or []) or args.prune == "":
        print(
            f"error: {'--prune' if args.prune == '' else 'a path'} is empty; expected a results.json, a run folder or a folder of runs "
            "(an empty path would mean the current folder)",
            file=sys.stderr,
        )
        return 2
    if args.at_peak is not None and not (args.targets or args.trend):
        print("error: --at-peak goes with --targets or --trend", file=sys.stderr)
        return 2
    for option, value in (
        ("--gpu-model", args.gpu_model),
        ("--html", args.html),
        ("--grid", args.grid),
        ("--impl", args.impl),
    ):
        if value is not None and not args.trend:
            print(f"error: {option} goes with --trend", file=sys.stderr)
            return 2
    if args.trend:
        if args.paths:
            print(
                f"error: --trend DIR takes no other paths (got {' '.join(args.paths)}); "
                "expected the reports folder alone",
                file=sys.stderr,
            )
            return 2
        peak = DEFAULT_PEAK_TFLOPS if args.at_peak is None else args.at_peak
        args.grid = args.grid or trend.GRID
        args.impl = args.impl or TARGET_IMPL
        return _main_trend(args, peak)
    if args.targets:
        if not args.paths:
            print("error: --targets needs a results.json or run folder", file=sys.stderr)
            return 2
        peak = DEFAULT_PEAK_TFLOPS if args.at_peak is None else args.at_peak
        return _main_targets(args.paths, peak)
    if args.prune:
        if args.paths:
            print(
                f"error: --prune DIR takes no other paths (got {' '.join(args.paths)}); "
                "render them in a command of their own",
                file=sys.stderr,
            )
            return 2
        return _main_prune(Path(args.prune))
    if args.scaling:
        if not args.paths:
            print("error: --scaling needs a results.json or run folder", file=sys.stderr)
            return 2
        return _main_scaling(args.paths)
    if not args.paths:
        print("error: give a results.json or run folder to render, or --prune DIR", file=sys.stderr)
        return 2
    status = 0
    pages: dict[Path, list[Path]] = {}  # page -> the results files that would write it
    pruned = 0
    for root in args.paths:
        try:
            files = _run_files(Path(root))
            if not files:
                raise ResultsError(f"{root}: no results.json (or results.json.gz) found")
            named = Path(root).resolve()
            for json_path in files:
                if json_path.name == RESULTS_GZ and named not in (
                    json_path.resolve(),
                    json_path.parent.resolve(),
                ):
                    pruned += 1  # a folder of runs: its pruned runs stay without their page
                    continue
                same = pages.setdefault(page_of(json_path).resolve(), [])
                if json_path.resolve() not in (p.resolve() for p in same):
                    same.append(json_path)
        except ResultsError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
    clashes = {page: files for page, files in pages.items() if len(files) > 1}
    for page, files in clashes.items():
        print(
            f"error: {' and '.join(map(str, files))} would each write {page}, one over the other; "
            "give one of them",
            file=sys.stderr,
        )
    if clashes:
        return 2  # before any page is written: which one would be left there is an accident
    if pruned:
        print(
            f"{pruned} pruned run(s) (results.json.gz, no page: `report --prune`) left as they are; "
            "name a run's folder to render its page"
        )
    for page, (json_path,) in pages.items():
        try:
            print(f"wrote {rerender(json_path)}")
        except ResultsError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
        except OSError as e:
            print(f"error: {json_path.parent}: cannot write {page.name}: {e.strerror or e}", file=sys.stderr)
            status = 2
    return status


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="render index.html from results.json; --prune old pages",
        description=__doc__.splitlines()[0].replace("``", ""),
    )
    p.add_argument("paths", nargs="*", help="results.json files, run folders, or folders of run folders")
    p.add_argument(
        "--prune",
        metavar="DIR",
        help="compress results.json to results.json.gz and delete index.html of all but the newest run "
        "per GPU model, kind and grid; of those, a sweep or parity run on another grid than the main "
        "one (the default sweep; parity on all bundles with --mutations) loses its page once a run on "
        "the main grid is newer",
    )
    p.add_argument(
        "--scaling",
        action="store_true",
        help="print each run's fixed cost and steady rate per series of prefix lengths instead of rendering",
    )
    p.add_argument(
        "--targets",
        action="store_true",
        help="print the kernel's target cases (the default grid's targets group) as a markdown table instead of rendering",
    )
    p.add_argument(
        "--trend",
        metavar="DIR",
        help="print, per GPU model, a line per committed sweep run of the default grid (newest first: "
        "board, target cases at 50 %%, the H=8 T=16 cases, the series' line) and each target case's "
        "newest time against its fastest earlier one, instead of rendering",
    )
    p.add_argument(
        "--gpu-model",
        metavar="NAME",
        help="with --trend: only GPU models whose name holds NAME (case-insensitive), e.g. H200",
    )
    p.add_argument(
        "--grid",
        metavar="NAME",
        help=f"with --trend: the runs of this grid (default {trend.GRID}; sm120 times sm_120's entries)",
    )
    p.add_argument(
        "--impl",
        metavar="NAME",
        help=f"with --trend: the kernel's registry entry whose rows to follow (default {TARGET_IMPL}; "
        "on the sm120 grid verify-attn-cuda-small or verify-attn-cuda-small-m32)",
    )
    p.add_argument(
        "--html",
        type=nonempty_path("a file for the trend's page"),
        metavar="FILE",
        help="with --trend: also write the trend as a self-contained page (a plot of every target case "
        "over the runs, and the tables) to FILE",
    )
    p.add_argument(
        "--at-peak",
        type=positive_number("TFLOP/s"),
        metavar="TFLOPS",
        help=f"with --targets or --trend: the fixed bf16 peak of the second %% of floor (default {DEFAULT_PEAK_TFLOPS:g})",
    )
    p.set_defaults(func=main)
