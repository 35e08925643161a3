"""The six canonical bundles: size, shapes, reproducibility, goldens, and data that shows bugs."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import bundles, readout, tree
from harness.batch import V_DIM, VerifyBatch
from harness.oracle import reference
from harness.parity import REL_TOL

SMALL = ["smoke", "ddtree", "ragged"]
LARGE = ["kimi-k2-tp8", "two-long", "deepseek-v3-200k"]
REPO = bundles.BUNDLES_DIR.parent

# (prefix lens, tree sizes, heads) of DESIGN.md section 3
SPEC = {
    "smoke": ([1000], [4], 8),
    "ddtree": ([4093], [16], 16),
    "ragged": ([0, 1, 777, 8192, 30001], [1, 4, 16, 33, 64], 8),
    "kimi-k2-tp8": ([65536], [16], 8),
    "two-long": ([131072, 100003], [33, 16], 64),
    "deepseek-v3-200k": ([200000], [64], 16),
}
Loader = Callable[[str], bundles.Bundle]


def test_fixture_sizes_fit_the_budget() -> None:
    sizes = {name: bundles.bundle_path(name).stat().st_size for name in bundles.CANONICAL}
    assert max(sizes.values()) <= 16 * 10**6, sizes
    assert sum(sizes.values()) <= 24 * 10**6, sizes


@pytest.mark.parametrize("name", list(bundles.CANONICAL))
def test_bundle_has_the_designed_shapes(name: str, bundle: Loader) -> None:
    b = bundle(name)
    prefix_lens, sizes, heads = SPEC[name]
    assert list(b.prefix_lens) == prefix_lens
    assert list(b.num_draft) == sizes
    assert b.num_heads == heads and b.q.shape == (sum(sizes), heads, 576)
    assert b.sm_scale == 1 / math.sqrt(192)
    assert b.certified_margin > readout.KAPPA


def test_smoke_tree_is_a_chain(bundle: Loader) -> None:
    assert bundle("smoke").parents == (tree.chain(4),)


@pytest.mark.parametrize("name", list(bundles.CANONICAL))
def test_kv_indices_scatter_over_a_larger_pool(name: str, bundle: Loader) -> None:
    b = bundle(name)
    k = b.kv_indices.numel()
    assert b.pool_slots == math.ceil(1.25 * k) + 17
    assert torch.unique(b.kv_indices).numel() == k
    steps = b.kv_indices[1:].long() - b.kv_indices[:-1].long()
    assert (steps == 1).float().mean() < 0.01  # not a contiguous layout


@pytest.mark.parametrize("name", list(bundles.CANONICAL))
def test_saving_a_loaded_bundle_gives_the_same_bytes(name: str, bundle: Loader) -> None:
    assert bundles.to_bytes(bundle(name)) == bundles.bundle_path(name).read_bytes()


def same_software(b: bundles.Bundle) -> bool:
    return b.provenance.get("torch") == str(torch.__version__) and b.provenance.get("numpy") == np.__version__


def regenerate_in_a_fresh_process(name: str) -> bytes:
    code = (
        "import sys; from harness import bundles; "
        f"sys.stdout.buffer.write(bundles.to_bytes(bundles.generate(bundles.CANONICAL[{name!r}])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, check=True, timeout=1800
    )
    return done.stdout


def check_regeneration(b: bundles.Bundle) -> None:
    if not same_software(b):
        pytest.skip(
            f"bundle written with torch {b.provenance.get('torch')} / numpy {b.provenance.get('numpy')}; "
            "regeneration is byte-identical only on the same software"
        )
    assert regenerate_in_a_fresh_process(b.name) == bundles.bundle_path(b.name).read_bytes()


@pytest.mark.parametrize("name", SMALL)
def test_regenerating_gives_identical_bytes(name: str, bundle: Loader) -> None:
    check_regeneration(bundle(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_regenerating_a_large_bundle_gives_identical_bytes(name: str, bundle: Loader) -> None:
    check_regeneration(bundle(name))


def check_goldens(b: bundles.Bundle, batch: VerifyBatch) -> None:
    out, lse = reference(batch)
    # the stored goldens are the float64 oracle rounded to fp32
    assert torch.equal(out.to(torch.float32), b.golden_out)
    assert torch.equal(lse.to(torch.float32), b.golden_lse)
    tokens = readout.target_tokens(out, b.readout_seed)
    assert np.array_equal(tokens, b.target_tokens.numpy())
    # the margin is certified on the stored fp32 goldens, to the last bit on any CPU
    assert readout.certified_ratios(b.golden_out, b.readout_seed).min() == b.certified_margin
    assert readout.certified_ratios(out, b.readout_seed).min() == pytest.approx(b.certified_margin, rel=1e-6)
    paths = readout.accepted_paths(b.parents, b.qo_indptr.tolist(), b.draft_tokens.numpy(), tokens)
    assert tuple(tuple(p) for p in paths) == b.accepted_paths


@pytest.mark.parametrize("name", SMALL)
def test_goldens_recompute(name: str, bundle: Loader, batch: Callable[[str], VerifyBatch]) -> None:
    check_goldens(bundle(name), batch(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_goldens_of_a_large_bundle_recompute(
    name: str, bundle: Loader, batch: Callable[[str], VerifyBatch]
) -> None:
    check_goldens(bundle(name), batch(name))


@pytest.mark.parametrize("name", list(bundles.CANONICAL))
def test_accepted_paths_follow_matching_draft_tokens(name: str, bundle: Loader) -> None:
    b = bundle(name)
    qo = b.qo_indptr.tolist()
    for r, (parents, path) in enumerate(zip(b.parents, b.accepted_paths, strict=True)):
        targets, drafts = b.target_tokens[qo[r] : qo[r + 1]], b.draft_tokens[qo[r] : qo[r + 1]]
        assert path[0] == 0
        for node, nxt in pairwise(path):
            assert parents[nxt] == node and drafts[nxt] == targets[node]
        last = path[-1]
        assert all(drafts[c] != targets[last] for c in tree.children(parents)[last])
    assert all(len(p) > 1 for p, t in zip(b.accepted_paths, b.num_draft, strict=True) if t > 1)


# --- the data design: planted rows decide their rows -------------------------------------------


def planted_positions(b: bundles.Bundle, r: int) -> dict[int, torch.Tensor]:
    """Request r's planted rows by kv position (prefix positions, then P + draft node)."""
    kv = b.kv_indices[int(b.kv_indptr[r]) : int(b.kv_indptr[r + 1])].tolist()
    where = {slot: pos for pos, slot in enumerate(kv)}
    return {
        where[int(s)]: row for s, row in zip(b.planted_slots, b.planted_rows, strict=True) if int(s) in where
    }


def toggled_change(b: bundles.Bundle, row: int, head: int, key: torch.Tensor, add: bool) -> float:
    """Relative change of output row (row, head) when ``key`` is added to / removed from its keys,
    computed exactly from the golden output and lse."""
    k = key.double()
    q = b.q[row, head].double()
    out, lse = b.golden_out[row, head].double(), float(b.golden_lse[row, head])
    weight = math.exp(float(q @ k) * b.sm_scale - lse)  # the key's share of the current mass
    sign = 1.0 if add else -1.0
    new = (out + sign * weight * k[:V_DIM]) / (1 + sign * weight)
    return float((new - out).norm() / out.norm())


@pytest.mark.parametrize("name", SMALL)
def test_every_needle_and_sink_decides_some_row(name: str, bundle: Loader) -> None:
    b = bundle(name)
    qo = b.qo_indptr.tolist()
    for r, p in enumerate(b.prefix_lens):
        for pos, key in planted_positions(b, r).items():
            if pos >= p:
                continue
            change = max(
                toggled_change(b, i, h, key, add=False)
                for i in range(qo[r], qo[r + 1])
                for h in range(b.num_heads)
            )
            assert change > 10 * REL_TOL, (
                f"request {r}: dropping prefix position {pos} moves no row by 10x tol"
            )


@pytest.mark.parametrize("name", SMALL)
def test_needles_sit_at_the_edges_and_at_every_power_of_two_boundary(name: str, bundle: Loader) -> None:
    b = bundle(name)
    for r, p in enumerate(b.prefix_lens):
        positions = set(planted_positions(b, r))
        expected = {x for x in (0, 1, p - 2, p - 1) if 0 <= x < p}
        boundary = 16
        while boundary < p:
            expected |= {boundary - 1, boundary}
            boundary *= 2
        assert expected <= positions, f"request {r}: missing {sorted(expected - positions)}"


@pytest.mark.parametrize("name", SMALL)
def test_a_third_of_the_needles_score_through_rope_alone(name: str, bundle: Loader) -> None:
    b = bundle(name)
    qo = b.qo_indptr.tolist()
    for r, p in enumerate(b.prefix_lens):
        needles = [(pos, k) for pos, k in planted_positions(b, r).items() if 1 <= pos < p]
        q = b.q[qo[r] : qo[r + 1]].double()
        rope_only = 0
        for _, key in needles:
            k = key.double()
            full = torch.einsum("thd,d->th", q, k) * b.sm_scale
            t, h = divmod(int(torch.argmax(full)), b.num_heads)
            nope = float(q[t, h, :V_DIM] @ k[:V_DIM]) * b.sm_scale
            rope_only += abs(nope) < 0.5 and float(full[t, h]) > math.log(p) + 2
        assert rope_only >= len(needles) // 3


@pytest.mark.parametrize("name", SMALL)
def test_the_sink_takes_about_30_percent_of_the_prefix_mass(
    name: str, bundle: Loader, batch: Callable[[str], VerifyBatch]
) -> None:
    b, bt = bundle(name), batch(name)
    qo = b.qo_indptr.tolist()
    for r, p in enumerate(b.prefix_lens):
        if p < 100:
            continue
        slots = bt.kv_indices[int(b.kv_indptr[r]) : int(b.kv_indptr[r]) + p].long()
        keys = bt.kv_cache[slots].double()
        scores = torch.einsum("thd,kd->thk", b.q[qo[r] : qo[r + 1]].double(), keys) * b.sm_scale
        weights = torch.softmax(scores, dim=-1)
        no_needle = weights[..., 1:].max(dim=-1).values < 0.1  # rows that no needle dominates
        assert int(no_needle.sum()) >= 4
        share = float(weights[..., 0][no_needle].median())
        assert 0.15 < share < 0.5, f"request {r}: median sink share {share:.3f} in rows without a needle"


@pytest.mark.parametrize("name", SMALL)
def test_draft_visibility_decides_the_aligned_rows(name: str, bundle: Loader) -> None:
    """For each draft key j and each aligned later token i, hiding j from a descendant (or
    showing it to a non-descendant) moves row (i, j % H) beyond twice the tolerance, so a wrong
    bit fails parity even on top of an honest kernel's own error."""
    b = bundle(name)
    qo = b.qo_indptr.tolist()
    for r, (p, parents) in enumerate(zip(b.prefix_lens, b.parents, strict=True)):
        keys = planted_positions(b, r)
        vis = tree.visibility(parents)
        for j in range(len(parents)):
            for i in bundles.draft_alignment(parents, j):
                change = toggled_change(b, qo[r] + i, j % b.num_heads, keys[p + j], add=not bool(vis[i, j]))
                assert change > 2 * REL_TOL, (
                    f"request {r}: mask bit ({i}, {j}) moves row ({i}, {j % b.num_heads}) by {change:.3g}"
                )


@pytest.mark.parametrize("name", list(bundles.CANONICAL))
def test_each_position_target_is_the_token_planted_in_its_own_key(name: str, bundle: Loader) -> None:
    # Why the goldens certify: each draft position's output points at the code its own key carries,
    # so the readout's argmax over the golden output is that token at every position.
    b = bundle(name)
    qo = b.qo_indptr.tolist()
    for r in range(len(b.prefix_lens)):
        planted = bundles.planted_tokens(b.recipe["seed"], r, qo[r + 1] - qo[r])
        got = b.target_tokens[qo[r] : qo[r + 1]].numpy()
        wrong = np.flatnonzero(got != planted).tolist()
        assert not wrong, f"request {r}: positions {wrong} target {got[wrong]}, planted {planted[wrong]}"


# ---------------------------------------------------------------------------------------------
# The bundles command


def run_bundles_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness")
    bundles.register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bundles", *argv])
    return args.func(args)


@pytest.mark.parametrize("command", ["list", "generate", "verify"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("smoke,nope", "--bundles: unknown bundle(s) nope; known: smoke, "),
        (",", "--bundles ',' names no bundle"),
    ],
)
def test_an_unknown_bundle_name_exits_2_naming_the_option(
    command: str, value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--out", str(tmp_path)] if command == "generate" else []
    assert run_bundles_cli(command, "--bundles", value, *extra) == 2
    assert message in capsys.readouterr().err


def test_generate_into_an_out_that_is_a_file_exits_2_before_generating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_generate(*args: object, **kwargs: object) -> None:
        raise AssertionError("generated although --out cannot be written")

    monkeypatch.setattr(bundles, "generate", no_generate)
    out = tmp_path / "file"
    out.write_text("not a folder")
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(out)) == 2
    assert f"--out {out} is a file; expected a folder" in capsys.readouterr().err


def test_save_is_atomic_and_leaves_no_temp_file_when_the_write_fails(
    tmp_path: Path, bundle: Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "smoke.pt"
    target.write_bytes(b"the previous bundle")

    def no_space(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="No space left"):
        bundles.save(bundle("smoke"), target)
    assert target.read_bytes() == b"the previous bundle"
    assert [p.name for p in tmp_path.iterdir()] == ["smoke.pt"]


@pytest.mark.parametrize(
    ("option", "message"), [("--out", "--out is empty"), ("--bundles", "--bundles '' names no bundle")]
)
def test_generate_with_an_empty_value_exits_2_naming_the_option(
    option: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_generate(*args: object, **kwargs: object) -> None:
        raise AssertionError("generated although an argument was empty")

    monkeypatch.setattr(bundles, "generate", no_generate)
    monkeypatch.chdir(tmp_path)  # where an empty --out would write
    argv = {"--bundles": "smoke", "--out": str(tmp_path / "out"), option: ""}
    assert run_bundles_cli("generate", *(x for kv in argv.items() for x in kv)) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_generate_onto_a_folder_named_like_the_bundle_exits_2_before_generating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_generate(*args: object, **kwargs: object) -> None:
        raise AssertionError("generated although smoke.pt cannot be written")

    monkeypatch.setattr(bundles, "generate", no_generate)
    (tmp_path / "smoke.pt").mkdir()
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(tmp_path)) == 2
    assert f"bundles: --out {tmp_path}: smoke.pt there is a folder" in capsys.readouterr().err


def test_generate_that_cannot_write_its_bundle_exits_2_naming_out(
    tmp_path: Path, bundle: Loader, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_space(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundles, "generate", lambda recipe, log=None: bundle("smoke"))
    monkeypatch.setattr(bundles, "atomic_write_bytes", no_space)
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(tmp_path)) == 2
    assert f"bundles: --out {tmp_path}: cannot write smoke.pt there (No space left on device)" in (
        capsys.readouterr().err
    )


# ---------------------------------------------------------------------------------------------
# The manifest: the committed files' whole-file sha256, kept apart from them


def test_the_manifest_records_every_committed_bundle_as_it_is() -> None:
    import hashlib

    recorded = bundles.read_manifest()
    assert set(recorded) == {f"{n}.pt" for n in bundles.CANONICAL}
    for name, digest in recorded.items():
        assert hashlib.sha256((bundles.BUNDLES_DIR / name).read_bytes()).hexdigest() == digest, name


def _committed_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bundles folder of smoke.pt and its manifest entry, standing in for the committed one."""
    folder = tmp_path / "bundles"
    folder.mkdir()
    (folder / "smoke.pt").write_bytes((bundles.BUNDLES_DIR / "smoke.pt").read_bytes())
    monkeypatch.setattr(bundles, "BUNDLES_DIR", folder)
    monkeypatch.setattr(bundles, "MANIFEST", folder / "SHA256SUMS")
    bundles.write_manifest({"smoke.pt": _digest(folder / "smoke.pt")})
    return folder


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_edited_committed_bundle_is_refused_though_its_pool_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's sha256 sits in the file and covers the pool only: goldens replaced by a mutant's
    (here: every golden out row scaled) would load and pass it, and a wrong kernel would then pass
    parity. The manifest refuses the file."""
    folder = _committed_copy(tmp_path, monkeypatch)
    good = bundles.load("smoke")
    edited = bundles.from_dict(
        {**good.to_dict(), "goldens": {**good.to_dict()["goldens"], "out": good.golden_out * 1.5}}
    )
    bundles.materialise(edited)  # the pool's own check passes
    bundles.save(edited, folder / "smoke.pt")
    with pytest.raises(
        bundles.BundleError, match=r"smoke.pt: its sha256 .* is not the .* that SHA256SUMS records"
    ):
        bundles.load("smoke")
    # the same file anywhere else is a user's own bundle, loaded on its own checks
    elsewhere = tmp_path / "mine.pt"
    elsewhere.write_bytes((folder / "smoke.pt").read_bytes())
    assert torch.equal(bundles.load(elsewhere).golden_out, good.golden_out * 1.5)


def test_generate_into_the_bundles_folder_writes_the_manifest_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _committed_copy(tmp_path, monkeypatch)
    bundles.write_manifest({"smoke.pt": "0" * 64})  # stale
    with pytest.raises(bundles.BundleError, match="SHA256SUMS"):
        bundles.load("smoke")
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(folder)) == 0
    assert bundles.read_manifest() == {"smoke.pt": _digest(folder / "smoke.pt")}
    assert bundles.load("smoke").name == "smoke"


def test_generate_keeps_a_bundle_of_other_bytes_and_exits_1_unless_forced(
    tmp_path: Path, bundle: Loader, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file the recipe does not regenerate byte for byte (another torch or numpy, or an edit)
    holds goldens that parity trusts: it is replaced only with --force."""
    monkeypatch.setattr(bundles, "generate", lambda recipe, log=None: bundle("smoke"))
    target = tmp_path / "smoke.pt"
    target.write_bytes(b"another generator's smoke")
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(tmp_path)) == 1
    assert f"bundles: {target} exists with other bytes" in capsys.readouterr().err
    assert target.read_bytes() == b"another generator's smoke"
    assert [p.name for p in tmp_path.iterdir()] == ["smoke.pt"]
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(tmp_path), "--force") == 0
    assert target.read_bytes() == bundles.to_bytes(bundle("smoke"))


def test_generate_over_identical_bytes_leaves_the_file_and_reports_it_unchanged(
    tmp_path: Path, bundle: Loader, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_write(path: Path, data: bytes) -> None:
        raise AssertionError("rewrote a file whose bytes are the regenerated ones")

    monkeypatch.setattr(bundles, "generate", lambda recipe, log=None: bundle("smoke"))
    (tmp_path / "smoke.pt").write_bytes(bundles.to_bytes(bundle("smoke")))
    monkeypatch.setattr(bundles, "atomic_write_bytes", no_write)
    assert run_bundles_cli("generate", "--bundles", "smoke", "--out", str(tmp_path)) == 0
    assert "unchanged (regenerated bytes identical)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(seed=-1), r"recipe: seed = -1, expected an int in \[0, 2\^32\)"),
        (lambda r: r.update(sm_scale=0.0), "recipe: sm_scale = 0.0, expected a finite positive number"),
        (
            lambda r: r.update(sm_scale=float("nan")),
            "recipe: sm_scale = nan, expected a finite positive number",
        ),
        (lambda r: r.update(requests=[5]), r"recipe: requests\[0\] is int, expected a table"),
        (
            lambda r: r.update(requests=[{**r["requests"][0], "tree_seed": -1}]),
            r"recipe: requests\[0\]\.tree_seed = -1, expected an int in \[0, 2\^32\)",
        ),
    ],
)
def test_a_bad_recipe_value_is_named(edit: Callable[[dict], None], message: str) -> None:
    recipe = {
        **bundles.CANONICAL["smoke"],
        "requests": [dict(q) for q in bundles.CANONICAL["smoke"]["requests"]],
    }
    edit(recipe)
    with pytest.raises(bundles.BundleError, match=message):
        bundles.check_recipe(recipe)
