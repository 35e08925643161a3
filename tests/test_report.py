"""The HTML report rendered from committed results files (tests/data), and its CLI.

``sweep-h200/results.json`` is a small sweep as an H200 writes it (three implementations, two
modes, an error row, a throttled row); ``parity-cpu/results.json`` a CPU parity run with
unavailable implementations and mutation controls.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

import harness.report
from harness.cli import main as cli_main
from harness.report import (
    MAX_CASE_BARS,
    ceilings_table,
    parity_tables,
    prune,
    render_html,
    speedup_plots,
    summary_table,
    write_run,
)
from harness.results import ParityRow, Results, ResultsError, compress_results, load_results

# Pruning asks git which runs count: git must reach the tests' own folders, whatever GIT_DIR the
# caller set.
pytestmark = pytest.mark.usefixtures("own_git_repositories")

DATA = Path(__file__).parent / "data"
SWEEP = DATA / "sweep-h200" / "results.json"
PARITY = DATA / "parity-cpu" / "results.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_html() -> str:
    return render_html(load_results(SWEEP), str(SWEEP))


@pytest.fixture(scope="module")
def parity_html() -> str:
    return render_html(load_results(PARITY), str(PARITY))


def _section(page: str, anchor: str) -> str:
    """The page from the heading with id ``anchor`` to the next h2."""
    start = page.index(f'id="{anchor}"')
    end = page.find("<h2", start)
    return page[start : end if end > 0 else len(page)]


def _rows_details(page: str) -> str:
    """The collapsed table of every sweep row."""
    start = page.index('<details id="rows">')
    return page[start : page.index("</details>", start)]


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


# ---------------------------------------------------------------------------------------------
# Sweep page


def test_sweep_page_has_every_section(sweep_html: str) -> None:
    for anchor in ("sweep", "latency", "floor", "speedup", "environment"):
        assert f'id="{anchor}"' in sweep_html
    assert "<title>verify-attention sweep on NVIDIA H200</title>" in sweep_html


def test_sweep_page_embeds_png_plots_and_loads_nothing_from_outside(sweep_html: str) -> None:
    images = _images(sweep_html)
    # latency, % of floor, and one speedup figure per later implementation (sglang, oracle)
    assert len(images) == 4
    assert all(img.startswith(PNG_MAGIC) and len(img) > 5000 for img in images)
    assert not re.search(r'(src|href)="(https?:)?//', sweep_html)
    assert "<link" not in sweep_html and "<script" not in sweep_html


def test_sweep_summary_table_shows_every_case_with_medians_floor_and_speedups(sweep_html: str) -> None:
    results = load_results(SWEEP)
    table = _section(sweep_html, "sweep")
    for case in {r.case_id for r in results.sweep}:
        assert f">{case}<" in table
    row = next(
        r for r in results.sweep if r.case_id == "B1-P4096-T16-H8-shuffled" and r.impl == "verify-attn-cuda"
    )
    assert f"{row.median_ms:.4g} ms" in table
    assert f"{row.pct_of_floor:.3g} % of floor" in table
    assert f"{row.speedup['sglang-triton-ps1']:.3f}x" in table  # three decimals below 10x
    assert "verify-attn-cuda<br>over sglang-triton-ps1" in table


def test_sweep_page_warns_about_error_rows_and_throttled_rows(sweep_html: str) -> None:
    head = sweep_html[: sweep_html.index('id="sweep"')]
    assert "1 row could not be timed" in head
    assert (
        "B1-P262144-T16-H64-shuffled sglang-triton-ps1 graph</span>: RuntimeError: CUDA error: out of memory"
        in head
    )
    assert "1 row ran while the GPU was throttled" in head
    assert "B1-P262144-T16-H64-shuffled verify-attn-cuda cold</span>: sw_power_cap" in head


def test_sweep_page_lists_every_row_with_its_repro_command(sweep_html: str) -> None:
    results = load_results(SWEEP)
    details = _rows_details(sweep_html)
    assert details.split("<tbody>")[1].count("<tr>") == len(results.sweep)
    for r in results.sweep:
        assert r.repro in details


def test_sweep_rows_name_the_config_the_implementation_ran() -> None:
    results = load_results(SWEEP)
    rows = [replace(r, impl_config="small-m32") if r.impl == "verify-attn-cuda" else r for r in results.sweep]
    details = _rows_details(render_html(replace(results, sweep=rows), str(SWEEP)))
    body = details.split("<tbody>")[1]
    assert body.count("small-m32") == sum(r.impl == "verify-attn-cuda" for r in rows) > 0
    # a results file written before the field existed reads as "" and shows "-"
    assert all(r.impl_config == "" for r in results.sweep)


def test_sweep_rows_show_sm_clock_and_temperature_before_and_after(sweep_html: str) -> None:
    details = _rows_details(sweep_html)
    throttled = details[details.index(">B1-P262144-T16-H64-shuffled<") :].split("</tr>")[0]
    assert "1980→1755, 52→71" in throttled and "throttled" in throttled


def test_a_throttled_row_read_per_sample_shows_how_many_samples_were_capped() -> None:
    results = load_results(SWEEP)
    hot = next(i for i, r in enumerate(results.sweep) if r.throttled)
    n = len(results.sweep[hot].samples_ms)
    rows = list(results.sweep)
    rows[hot] = replace(rows[hot], throttled_samples=[0, 2, 3])
    details = _rows_details(render_html(replace(results, sweep=rows), str(SWEEP)))
    row = details[details.index(f">{rows[hot].case_id}<") :].split("</tr>")[0]
    assert f"throttled, 3/{n} samples" in row
    # a results file written before samples were read one by one shows the row's flag alone
    assert all(r.throttled_samples is None for r in results.sweep)
    assert ">throttled<" in _rows_details(render_html(results, str(SWEEP)))


def test_table_cells_of_one_plain_element_are_written_as_cells_of_its_class(sweep_html: str) -> None:
    # the numbers are right-aligned cells (the td rule outranks a bare `.num` rule), not a div in
    # a cell; a cell of two elements, a pill or a note keeps its elements
    assert not re.search(r'<td><div class="num">[^<]*</div></td>', sweep_html)
    assert "<td><span>" not in sweep_html and '<td><div class="num">' in sweep_html
    assert '<td class="num">' in sweep_html and '<td class="mono">' in sweep_html
    assert "table.data td.num { text-align: right;" in sweep_html
    assert '<td><span class="pill' in sweep_html


def test_ceilings_of_a_run_before_the_empty_kernel_was_timed_show_a_dash() -> None:
    html = ceilings_table({"copy_bandwidth_gbs": 4000.0, "bf16_tflops": 800.0, "method": "m"})
    row = html[html.index("empty kernel between the events") :].split("</tr>")[0]
    assert '<td class="num muted">-</td>' in row


def test_sweep_page_shows_environment_and_ceilings(sweep_html: str) -> None:
    env = _section(sweep_html, "environment")
    for text in (
        "4321 GB/s",
        "812.5 TFLOP/s",
        "empty kernel between the events",
        "3.55 us",
        "gpu.uuid",
        "GPU-1f3e9a52",
        "gpu.driver",
        "570.124.06",
        "build_flags.arch",
    ):
        assert text in env


def test_speedup_bars_cover_each_later_implementation_in_the_run_order() -> None:
    plots = speedup_plots(load_results(SWEEP))
    assert [p["over"] for p in plots] == ["sglang-triton-ps1", "oracle"]
    assert "per case" in plots[0]["caption"]


def test_speedup_bars_become_group_summaries_beyond_the_case_limit() -> None:
    results = load_results(SWEEP)
    template = next(r for r in results.sweep if r.impl == "verify-attn-cuda" and r.mode == "cold")
    rows = []
    for i in range(MAX_CASE_BARS + 1):
        params = {**template.params, "prefix_len": 1000 + i}
        for impl, ms in (("a", 1.0), ("b", 2.0)):
            rows.append(
                replace(template, case_id=f"case{i}", impl=impl, params=params, median_ms=ms, speedup={})
            )
    rows = [replace(r, speedup={"b": 2.0} if r.impl == "a" else {"a": 0.5}) for r in rows]
    plots = speedup_plots(replace(results, sweep=rows))
    assert len(plots) == 1 and "geometric mean" in plots[0]["caption"]


def test_summary_table_marks_error_rows_instead_of_showing_a_time() -> None:
    table = summary_table(load_results(SWEEP), "graph")
    row = table[table.index(">B1-P262144-T16-H64-shuffled<") :].split("</tr>")[0]
    assert "error" in row


def test_rows_without_samples_are_not_plotted_or_counted_as_timed() -> None:
    results = load_results(SWEEP)
    # a row that could not run, as an A/B side writes it: status ok but no samples
    empty = replace(
        results.sweep[0],
        samples_ms=[],
        median_ms=0.0,
        min_ms=0.0,
        max_ms=0.0,
        iqr_ms=0.0,
        note="did not build",
    )
    page = render_html(replace(results, sweep=[empty, *results.sweep[1:]]))
    assert "2 rows could not be timed" in page and "did not build" in page


# ---------------------------------------------------------------------------------------------
# Parity page


def test_parity_page_keeps_controls_apart_from_implementations(parity_html: str) -> None:
    parity = _section(parity_html, "parity")
    real, controls = parity.split("<h3>Controls</h3>")
    assert "mutant:" not in real and "control:" not in real
    assert ">oracle<" in real and ">verify-attn-cuda<" in real
    assert (
        ">mutant:causal-mask<" in controls
        and ">control:oracle-bf16<" in controls
        and ">oracle<" not in controls
    )
    assert controls.count(">caught<") == 7 and controls.count(">holds<") == 1


def test_parity_page_summarises_statuses_and_controls(parity_html: str) -> None:
    assert "6 pass, 12 unavailable" in parity_html
    assert "controls: 8 of 8 as expected" in parity_html
    assert "did not behave as expected" not in parity_html


def test_parity_page_lists_unavailable_implementations_with_reasons(parity_html: str) -> None:
    head = parity_html[: parity_html.index('id="parity"')]
    assert "Unavailable implementations" in head
    assert "sglang is not installed (No module named &#39;sglang&#39;)" in head
    assert "needs a CUDA device, got cpu" in head


def test_parity_page_has_no_sweep_sections_or_plots(parity_html: str) -> None:
    assert 'id="latency"' not in parity_html and not _images(parity_html)


def test_a_mutation_control_that_never_fails_is_flagged_not_caught() -> None:
    results = load_results(PARITY)
    rows = [replace(p, status="pass") if p.impl == "mutant:drop-last-prefix" else p for p in results.parity]
    tables = parity_tables(replace(results, parity=rows))
    assert tables["controls_broken"] == ["mutant:drop-last-prefix"] and "NOT CAUGHT" in tables["controls"]
    assert "1 control did not behave as expected</b>\n  (mutant:drop-last-prefix)" in render_html(
        replace(results, parity=rows)
    )


def test_a_positive_control_that_fails_anywhere_is_flagged() -> None:
    results = load_results(PARITY)
    rows = [
        replace(p, status="fail") if (p.impl, p.bundle) == ("control:oracle-bf16", "ragged5-h8") else p
        for p in results.parity
    ]
    tables = parity_tables(replace(results, parity=rows))
    assert tables["controls_broken"] == ["control:oracle-bf16"] and ">FAILED<" in tables["controls"]


def test_a_failing_implementation_is_announced_at_the_top() -> None:
    results = load_results(PARITY)
    bad = ParityRow("ragged5-h8", "candidate", "fail", "target tokens differ at 2 draft positions", 0.2, 0.98)
    page = render_html(replace(results, parity=[*results.parity, bad]))
    head = page[: page.index('id="parity"')]
    assert "1 parity row failed" in head and "target tokens differ at 2 draft positions" in head


# ---------------------------------------------------------------------------------------------
# Files and errors


def test_write_run_writes_json_and_html_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    out = write_run(load_results(PARITY), tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "results.json"]
    assert load_results(out).to_json() == load_results(PARITY).to_json()


def test_write_run_writes_no_run_when_the_results_cannot_be_shown_only_the_results_aside(
    tmp_path: Path,
) -> None:
    results = load_results(SWEEP)
    broken = replace(results, sweep=[replace(results.sweep[0], samples_ms="fast")])
    with pytest.raises(ResultsError, match=r"sweep\[0\] .*samples_ms must be a list of numbers"):
        write_run(broken, tmp_path / "run")
    assert not (tmp_path / "run" / "results.json").exists() and not (tmp_path / "run" / "index.html").exists()
    assert (tmp_path / "run" / "results.unshown.json").is_file()


def test_write_run_refuses_results_it_could_not_read_back_and_keeps_them_aside(tmp_path: Path) -> None:
    bad = replace(load_results(PARITY), environment=None)
    with pytest.raises(ResultsError, match=r"environment must be an object, got None.*results.unshown.json"):
        write_run(bad, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["results.unshown.json"]
    kept = json.loads((tmp_path / "run" / "results.unshown.json").read_text())
    assert kept["environment"] is None and len(kept["parity"]) == len(bad.parity)


def test_write_run_writes_results_json_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """results.json is what every tool keys a run on: a page that fails to be written leaves none."""

    def no_space(path: Path, text: str, **kwargs: object) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(harness.report, "atomic_write_text", no_space)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(ResultsError, match="cannot write the run there \\(No space left on device\\)") as e:
        write_run(load_results(PARITY), tmp_path / "run")
    assert not (tmp_path / "run" / "results.json").exists()
    # The measurements are not lost: they are kept in a folder of their own, named in the error.
    (kept,) = (tmp_path / "tmp").glob("verify-attention-unwritten-*/results.json")
    assert str(kept) in str(e.value)
    assert load_results(kept).to_json() == load_results(PARITY).to_json()


@pytest.fixture
def kept_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, where write_run keeps results it could not write."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


def _kept(kept_dir: Path, message: str) -> Results:
    (kept,) = kept_dir.glob("verify-attention-unwritten-*/results.json")
    assert str(kept) in message
    return load_results(kept)


def test_write_run_leaves_a_page_another_run_wrote_meanwhile(
    tmp_path: Path, kept_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs writing one folder (one --out, or default names of one second): the second to
    write its page finds the first's and keeps its results aside, never replacing the page."""
    run = tmp_path / "run"
    render = harness.report.render_html

    def slow_render(results: Results, source: str) -> str:  # the other run writes while this renders
        run.mkdir(exist_ok=True)
        (run / "index.html").write_text("the other run's page")
        return render(results, source)

    monkeypatch.setattr(harness.report, "render_html", slow_render)
    with pytest.raises(ResultsError, match=f"{run}: already holds an index.html .* left as it was") as e:
        write_run(load_results(PARITY), run)
    assert sorted(p.name for p in run.iterdir()) == ["index.html"]
    assert (run / "index.html").read_text() == "the other run's page"
    assert _kept(kept_dir, str(e.value)).to_json() == load_results(PARITY).to_json()


def test_write_run_leaves_results_another_run_wrote_after_its_page(
    tmp_path: Path, kept_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    write_page = harness.report.atomic_write_text

    def page_then_other_results(path: Path, text: str, **kwargs: object) -> None:
        write_page(path, text, **kwargs)
        (run / "results.json").write_text("the other run's results")

    monkeypatch.setattr(harness.report, "atomic_write_text", page_then_other_results)
    with pytest.raises(ResultsError, match="cannot write the run there") as e:
        write_run(load_results(PARITY), run)
    # this run's page is taken back; the other run's results are as it wrote them
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]
    assert (run / "results.json").read_text() == "the other run's results"
    _kept(kept_dir, str(e.value))


def test_write_run_keeps_the_results_when_the_page_fails_for_any_reason(
    tmp_path: Path, kept_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a plot, a missing package, memory: hours of timing are not lost to the page."""

    def broken_render(results: Results, source: str) -> str:
        raise RuntimeError("a plot that fails")

    monkeypatch.setattr(harness.report, "render_html", broken_render)
    with pytest.raises(
        ResultsError, match=r"the page could not be rendered \(RuntimeError: a plot that fails\)"
    ) as e:
        write_run(load_results(PARITY), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert _kept(kept_dir, str(e.value)).to_json() == load_results(PARITY).to_json()


def test_ctrl_c_while_the_report_is_written_keeps_the_results_and_says_where(
    tmp_path: Path, kept_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def interrupted(results: Results, source: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.report, "render_html", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_run(load_results(PARITY), tmp_path / "run")
    err = capsys.readouterr().err
    assert "the report was not written" in err
    assert _kept(kept_dir, err).to_json() == load_results(PARITY).to_json()


@pytest.mark.parametrize("held", ["results.json", "results.json.gz"])
def test_write_run_into_a_folder_holding_a_run_leaves_it_as_it_was(
    held: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commands refuse such an --out before the run; a run that appeared there since is not
    replaced, nor given a page of other results: the new results are kept aside."""
    run = tmp_path / "run"
    run.mkdir()
    (run / held).write_bytes(b"the earlier run")
    (run / "index.html").write_text("the earlier page")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(ResultsError, match=f"{run}: already holds a run \\({held}\\), left as it was") as e:
        write_run(load_results(PARITY), run)
    assert sorted(p.name for p in run.iterdir()) == sorted([held, "index.html"])
    assert (run / held).read_bytes() == b"the earlier run" and (
        run / "index.html"
    ).read_text() == "the earlier page"
    (kept,) = (tmp_path / "tmp").glob("verify-attention-unwritten-*/results.json")
    assert str(kept) in str(e.value)


@pytest.mark.parametrize("held", ["results.json", "results.json.gz", "index.html", None])
def test_a_sweep_refuses_an_out_holding_a_run_or_empty_before_timing(
    held: str | None, tmp_path: Path, capsys
) -> None:
    """write_run's callers check --out first: a sweep into an earlier run's folder, or into "" (the
    current folder, silently), exits 2 before any timing and leaves the folder as it was."""
    run = tmp_path / "run"
    run.mkdir()
    if held:
        (run / held).write_text("the earlier run")
    argv = ["sweep", "--device", "cpu", "--grid", "quick", "--impls", "oracle", "--case-filter", "P4096"]
    assert cli_main([*argv, "--out", str(run) if held else ""]) == 2
    err = capsys.readouterr().err
    if held == "index.html":
        assert f"--out {run} already holds an index.html" in err
    else:
        assert (f"--out {run} already holds a run ({held})" if held else "--out is empty") in err
    assert [p.name for p in run.iterdir()] == ([held] if held else [])


def test_report_names_the_page_of_a_results_file_of_another_name_after_it(tmp_path: Path, capsys) -> None:
    """A folder's index.html (the user's own page, or another run's) is not written over by the
    page of ``run-a.json``; two such files in one folder get a page each."""
    shutil.copy(PARITY, tmp_path / "run-a.json")
    shutil.copy(SWEEP, tmp_path / "run-b.json")
    (tmp_path / "index.html").write_text("my own page")
    assert cli_main(["report", str(tmp_path / "run-a.json"), str(tmp_path / "run-b.json")]) == 0
    assert (tmp_path / "index.html").read_text() == "my own page"
    assert "controls: 8 of 8 as expected" in (tmp_path / "run-a.html").read_text()
    assert "controls: 8 of 8" not in (tmp_path / "run-b.html").read_text()
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'run-a.html'}" in out and f"wrote {tmp_path / 'run-b.html'}" in out


def test_report_refuses_two_inputs_that_would_write_one_page_and_writes_none(tmp_path: Path, capsys) -> None:
    shutil.copy(PARITY, tmp_path / "run-a.json")
    shutil.copy(PARITY, tmp_path / "run-a.json.gz")  # plain text under a .gz name: still readable
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(PARITY, run / "results.json")
    assert cli_main(["report", str(tmp_path / "run-a.json"), str(tmp_path / "run-a.json.gz"), str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'run-a.json'} and {tmp_path / 'run-a.json.gz'} would each write" in err
    assert "run-a.html" in err
    assert not list(tmp_path.rglob("*.html"))
    # one run named twice (its folder and its file) is rendered once
    assert cli_main(["report", str(run), str(run / "results.json")]) == 0
    assert capsys.readouterr().out.count("wrote ") == 1


def test_a_report_whose_reader_goes_away_exits_1_without_a_traceback() -> None:
    """``report --scaling RUN | head -1``: the reader closes the pipe (here before the command
    writes anything), and the command stops without a BrokenPipeError's traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "report", "--scaling", str(SWEEP)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[1],
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_report_cli_regenerates_index_html_from_results_json(tmp_path: Path, capsys) -> None:
    run = tmp_path / "old-run"
    run.mkdir()
    shutil.copy(PARITY, run / "results.json")
    assert cli_main(["report", str(run)]) == 0
    assert "controls: 8 of 8 as expected" in (run / "index.html").read_text()
    assert f"wrote {run / 'index.html'}" in capsys.readouterr().out


def test_truncated_results_json_is_a_clear_error_naming_the_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "results.json"
    path.write_text(PARITY.read_text()[:500])
    assert cli_main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "not valid JSON (truncated or corrupt?)" in err
    assert not (tmp_path / "index.html").exists()


def test_wrong_schema_is_a_clear_error_naming_the_file_and_field(tmp_path: Path, capsys) -> None:
    doc = json.loads(PARITY.read_text())
    doc["schema_version"] = 7
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    assert cli_main(["report", str(path)]) == 2
    assert f"{path}: 'schema_version' is 7, this reader handles 1" in capsys.readouterr().err


def test_a_row_field_of_the_wrong_type_is_an_error_naming_file_row_and_field(tmp_path: Path, capsys) -> None:
    doc = json.loads(SWEEP.read_text())
    doc["sweep"][3]["median_ms"] = "fast"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    assert cli_main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "sweep[3]" in err and "median_ms must be a number, got 'fast'" in err


def test_report_of_a_folder_without_results_is_an_error(tmp_path: Path, capsys) -> None:
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "no results.json (or results.json.gz) found" in capsys.readouterr().err


def test_report_of_a_path_that_does_not_exist_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing"
    assert cli_main(["report", str(missing)]) == 2
    assert f"error: {missing}: no such file or folder" in capsys.readouterr().err


def test_report_into_a_folder_it_cannot_write_is_an_error_naming_the_folder(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a monkeypatched failure, not file modes: root writes into a read-only folder all the same
    def read_only(path: Path, text: str) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(PARITY, run / "results.json")
    monkeypatch.setattr(harness.report, "atomic_write_text", read_only)
    assert cli_main(["report", str(run)]) == 2
    assert f"error: {run}: cannot write index.html: Permission denied" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Pruning


def _run(
    root: Path, name: str, source: Path, created: str, gpu: str | None, command: str | None = None
) -> Path:
    doc = json.loads(source.read_text())
    doc["created_utc"] = created
    doc["environment"]["gpu"] = {"name": gpu} if gpu else None
    if command is not None:
        doc["command"] = command
    run = root / name
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(doc))
    (run / "index.html").write_text("<!doctype html>")
    return run


def test_prune_keeps_the_newest_page_per_gpu_model_and_kind(tmp_path: Path) -> None:
    old = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    new = _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    other_gpu = _run(tmp_path, "c", SWEEP, "2025-10-01T00:00:00+00:00", "NVIDIA RTX PRO 6000")
    parity = _run(tmp_path, "d", PARITY, "2025-10-01T00:00:00+00:00", "NVIDIA H200")
    changed, warnings, failures = prune(tmp_path)
    assert changed == [old / "index.html", old / "results.json.gz"] and warnings == [] == failures
    assert all((r / "index.html").exists() for r in (new, other_gpu, parity))
    assert all((r / "results.json").exists() for r in (new, other_gpu, parity))
    # The older run keeps its results, compressed: the same document, and its page renders again.
    assert not (old / "results.json").exists()
    assert load_results(old).to_json() == load_results(new).to_json() | {
        "created_utc": "2025-11-01T00:00:00+00:00"
    }
    assert cli_main(["report", str(old)]) == 0 and (old / "index.html").exists()


def test_prune_keeps_the_newest_page_per_grid(tmp_path: Path) -> None:
    """A quick or tensor-parallel sweep made after the default grid's run keeps its own page and
    leaves the default run's page alone (the history gate's grouping)."""

    def h200(name: str, date: str, args: str) -> Path:
        created = f"2025-{date}T00:00:00+00:00"
        return _run(tmp_path, name, SWEEP, created, "NVIDIA H200", f"python -m harness sweep{args}")

    default = h200("a", "11-01", "")
    quick = h200("b", "11-02", " --grid quick --gpus 2")
    tp = h200("c", "11-03", " --grid quick --tp 2")
    old_quick = h200("d", "10-01", " --grid quick")
    changed, warnings, failures = prune(tmp_path)
    assert changed == [old_quick / "index.html", old_quick / "results.json.gz"]
    assert warnings == [] == failures
    assert all((r / "index.html").exists() for r in (default, quick, tp))


def test_prune_gives_a_newer_main_grid_run_the_pages_of_other_grids_not_their_results(tmp_path: Path) -> None:
    """Once the default grid's run is newer, the older quick, tensor-parallel and narrowed runs
    of that GPU model and kind lose their pages (DESIGN.md: the HTML of a GPU model's latest run)
    and keep their plain results.json, the newest of their grid for the history gate; another GPU
    model's runs and another kind's are left alone."""

    def run(name: str, date: str, args: str, gpu: str = "NVIDIA H200", source: Path = SWEEP) -> Path:
        created = f"2025-{date}T00:00:00+00:00"
        tool = "sweep" if source == SWEEP else "parity"
        return _run(tmp_path, name, source, created, gpu, f"python -m harness {tool}{args}")

    quick = run("a", "10-01", " --grid quick")
    tp = run("b", "10-02", " --tp 2")
    narrowed = run("c", "10-03", " --modes cold")
    other_gpu_quick = run("d", "10-04", " --grid quick", gpu="NVIDIA H100 80GB HBM3")
    parity_some = run("e", "10-05", " --bundles b1", source=PARITY)
    default = run("f", "11-01", "")
    later_short = run("g", "11-02", " --grid short --gpus 2")
    # A/B runs have no main grid: a later one on the default grid takes no other A/B's page.
    ab_old = run("h", "10-06", " --grid quick")
    ab_new = run("i", "11-03", " --base-define VA_SMALL_SHAPE=32 --grid default")
    for ab in (ab_old, ab_new):
        doc = json.loads((ab / "results.json").read_text())
        (ab / "results.json").write_text(json.dumps(doc | {"kind": "ab"}))
    changed, warnings, failures = prune(tmp_path)
    assert warnings == [] == failures
    assert changed == [quick / "index.html", tp / "index.html", narrowed / "index.html"]
    for r in (quick, tp, narrowed):
        assert (r / "results.json").exists() and not (r / "results.json.gz").exists()
    kept = (other_gpu_quick, parity_some, default, later_short, ab_old, ab_new)
    assert all((r / "index.html").exists() and (r / "results.json").exists() for r in kept)
    assert prune(tmp_path) == ([], [], [])


def test_prune_counts_only_the_runs_git_tracks_or_would_track(tmp_path: Path) -> None:
    """A newer run in a git-ignored scratch folder neither takes the page from the newest
    committed run nor is pruned itself (the runs the history gate reads are the ones that count)."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("_work/\n")
    old = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    new = _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    scratch = _run(tmp_path / "_work", "c", SWEEP, "2025-11-03T00:00:00+00:00", "NVIDIA H200")
    scratch_old = _run(tmp_path / "_work", "d", SWEEP, "2025-10-03T00:00:00+00:00", "NVIDIA H200")
    changed, warnings, failures = prune(tmp_path)
    assert changed == [old / "index.html", old / "results.json.gz"] and warnings == [] == failures
    assert (new / "index.html").exists() and (new / "results.json").exists()
    for run in (scratch, scratch_old):
        assert (run / "index.html").exists() and (run / "results.json").exists()


def test_prune_takes_no_other_paths(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    assert cli_main(["report", "--prune", str(tmp_path), str(run)]) == 2
    assert "--prune DIR takes no other paths" in capsys.readouterr().err
    assert (run / "index.html").read_text() == "<!doctype html>"


def test_prune_twice_changes_nothing_more(tmp_path: Path) -> None:
    _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    first, _, _ = prune(tmp_path)
    packed = (tmp_path / "a" / "results.json.gz").read_bytes()
    assert len(first) == 2 and prune(tmp_path) == ([], [], [])
    assert (tmp_path / "a" / "results.json.gz").read_bytes() == packed


def test_a_compressed_results_file_that_is_cut_short_is_named(tmp_path: Path) -> None:
    run = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    prune(tmp_path)
    gz = run / "results.json.gz"
    gz.write_bytes(gz.read_bytes()[:40])
    with pytest.raises(ResultsError, match=r"results.json.gz: not a readable results file"):
        load_results(run)


def test_prune_leaves_unreadable_runs_alone_and_warns(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text("{")
    (bad / "index.html").write_text("<!doctype html>")
    assert cli_main(["report", "--prune", str(tmp_path)]) == 0
    assert (bad / "index.html").exists()
    assert "not valid JSON" in capsys.readouterr().err


def test_prune_of_a_path_that_does_not_exist_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing"
    assert cli_main(["report", "--prune", str(missing)]) == 2
    assert f"error: {missing}: no such file or folder" in capsys.readouterr().err


def test_prune_names_each_run_it_cannot_prune_and_prunes_the_rest(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    older = _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    _run(tmp_path, "c", SWEEP, "2025-11-03T00:00:00+00:00", "NVIDIA H200")
    compress = harness.report.compress_results

    def read_only_a(path: Path) -> Path:
        if path.parent == stuck:
            raise PermissionError(13, "Permission denied", str(path))
        return compress(path)

    monkeypatch.setattr(harness.report, "compress_results", read_only_a)
    assert cli_main(["report", "--prune", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: could not prune {stuck}: Permission denied" in err
    assert "1 run(s) could not be pruned" in err
    assert (stuck / "results.json").exists()
    assert (older / "results.json.gz").exists() and not (older / "index.html").exists()


def test_prune_leaves_a_run_it_cannot_read_alone_and_warns(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    unreadable = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    older = _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    _run(tmp_path, "c", SWEEP, "2025-11-03T00:00:00+00:00", "NVIDIA H200")
    read_bytes = Path.read_bytes

    def no_access(path: Path) -> bytes:
        if path == unreadable / "results.json":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", no_access)
    assert cli_main(["report", "--prune", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {unreadable / 'results.json'}: cannot read the results file: Permission denied" in err
    assert (unreadable / "index.html").exists() and (unreadable / "results.json").exists()
    assert (older / "results.json.gz").exists()


def test_prune_leaves_a_run_with_a_wrongly_typed_field_alone_and_warns(tmp_path: Path, capsys) -> None:
    bad = _run(tmp_path, "a", SWEEP, "2025-11-01T00:00:00+00:00", "NVIDIA H200")
    doc = json.loads((bad / "results.json").read_text())
    doc["created_utc"] = 5
    (bad / "results.json").write_text(json.dumps(doc))
    older = _run(tmp_path, "b", SWEEP, "2025-11-02T00:00:00+00:00", "NVIDIA H200")
    _run(tmp_path, "c", SWEEP, "2025-11-03T00:00:00+00:00", "NVIDIA H200")
    assert cli_main(["report", "--prune", str(tmp_path)]) == 0
    assert "created_utc must be a string, got 5 (left alone)" in capsys.readouterr().err
    assert (bad / "index.html").exists() and (bad / "results.json").exists()
    assert (older / "results.json.gz").exists()


@pytest.mark.parametrize("missing", ["jinja2", "matplotlib.figure", "PIL.Image"])
def test_a_sweep_missing_a_report_package_stops_before_timing(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The report's packages load only when it is written: a sweep checks them first, so an hour
    of timing never ends in an ImportError."""
    import harness.sweep

    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    timed = []
    monkeypatch.setattr(harness.sweep, "run_sweep", lambda *a, **kw: timed.append(a))
    argv = ["sweep", "--device", "cpu", "--grid", "quick", "--impls", "oracle", "--case-filter", "P4096"]
    assert cli_main([*argv, "--out", str(tmp_path / "run")]) == 2
    assert "the report cannot be written" in capsys.readouterr().err
    assert not timed and not (tmp_path / "run").exists()


def test_rendering_a_folder_of_runs_leaves_its_pruned_runs_pruned(tmp_path: Path, capsys) -> None:
    """``report reports/`` re-renders the runs that have a page; a pruned run (results.json.gz, no
    page) stays pruned unless it is named itself."""
    plain, pruned = tmp_path / "a-run", tmp_path / "b-run"
    for run in (plain, pruned):
        run.mkdir()
        shutil.copy(PARITY, run / "results.json")
    compress_results(pruned / "results.json")
    assert cli_main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (plain / "index.html").is_file() and not (pruned / "index.html").exists()
    assert "1 pruned run(s)" in out
    assert cli_main(["report", str(pruned)]) == 0
    assert (pruned / "index.html").is_file()


@pytest.mark.parametrize("argv", [["report", ""], ["report", "--prune", ""], ["report", "--targets", ""]])
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(argv: list[str], capsys) -> None:
    assert cli_main(argv) == 2
    assert "is empty; expected a results.json" in capsys.readouterr().err


def test_speedups_near_one_keep_their_decimals_and_large_ones_three_digits() -> None:
    # an A/B's verdicts work in % against 3 %: 1.004x must not read "1x"
    assert harness.report._times(1.004) == "1.004x" and harness.report._times(0.987) == "0.987x"
    assert harness.report._times(278.4) == "278x" and harness.report._times(39.44) == "39.4x"


@pytest.mark.parametrize(
    ("value", "fmt", "up", "shown"),
    [
        (0.010004, ".2e", True, "1.01e-02"),  # just past the 1e-2 limit: not "1.00e-02"
        (0.01, ".2e", True, "1.00e-02"),  # exactly the limit stays the limit
        (0.0012345, ".2e", True, "1.24e-03"),
        (0.99989996, ".6f", False, "0.999899"),  # just under the 0.9999 limit: not "0.999900"
        (0.9999, ".6f", False, "0.999900"),
        (None, ".2e", True, "-"),
    ],
)
def test_parity_numbers_round_away_from_the_passing_side(value, fmt: str, up: bool, shown: str) -> None:
    assert f">{shown}<" in harness.report._directed(value, fmt, up)


def test_a_tp_run_counts_and_summarises_its_steps_not_its_ranks() -> None:
    results = load_results(SWEEP)
    step = results.sweep[0]
    ranks = [replace(step, case_id=f"{step.case_id}-rank{k}", tp_rank=k, tp_size=2) for k in (0, 1)]
    tp = replace(results, sweep=[*results.sweep, *ranks])
    ctx = harness.report.context(tp)
    assert ctx["n_cases"] == harness.report.context(results)["n_cases"]
    assert "(2 of them tensor-parallel ranks' own)" in ctx["summary"][0]
    assert all("-rank0" not in t["html"] for t in ctx["summary_tables"])
    assert "-rank0" in ctx["rows_table"]  # the rows table keeps every rank


def test_an_implementation_name_with_dollars_renders() -> None:
    # matplotlib reads a pair of $ as a math formula, and a bad one raised
    results = load_results(SWEEP)
    odd = replace(
        results, sweep=[replace(r, impl=r.impl.replace("-", "$x_{", 1) + "$") for r in results.sweep]
    )
    assert "$x_{" in harness.report.render_html(odd)


def test_a_run_over_several_gpus_says_which_gpu_timed_each_row() -> None:
    results = load_results(SWEEP)
    assert ">GPU<" not in harness.report.rows_table(results)  # one GPU: no column
    spread = replace(results, sweep=[replace(r, gpu_index=i % 2) for i, r in enumerate(results.sweep)])
    assert ">GPU<" in harness.report.rows_table(spread)


def test_a_graph_only_run_keeps_its_floor_and_speedup_figures() -> None:
    results = load_results(SWEEP)
    graph = replace(results, sweep=[r for r in results.sweep if r.mode == "graph"])
    assert graph.sweep and all(r.mode == "graph" for r in graph.sweep)
    ctx = harness.report.context(graph)
    assert ctx["floor_plots"] and ctx["speedup_plots"]


def test_a_row_with_a_zero_median_is_said_to_be_one() -> None:
    results = load_results(SWEEP)
    zero = replace(results.sweep[0], median_ms=0.0, note="")
    (row,) = harness.report.context(replace(results, sweep=[zero]))["errors"]
    assert row["why"] == "a median of 0 ms: nothing to divide by"


def test_throttled_points_are_ringed_in_the_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    results = load_results(SWEEP)
    labels: list[str] = []
    real = harness.report._png

    def record(fig) -> str:
        labels.extend(t.get_text() for legend in fig.legends for t in legend.get_texts())
        return real(fig)

    monkeypatch.setattr(harness.report, "_png", record)
    calm = replace(results, sweep=[replace(r, throttled=False) for r in results.sweep])
    harness.report.prefix_plots(calm, "median_ms", "median ms", modes=["cold"], log_y=True)
    assert harness.report.THROTTLED_LABEL not in labels
    hot = replace(results, sweep=[replace(r, throttled=True) for r in results.sweep])
    harness.report.prefix_plots(hot, "median_ms", "median ms", modes=["cold"], log_y=True)
    assert harness.report.THROTTLED_LABEL in labels
