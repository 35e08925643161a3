"""Bad bundle files: each is refused with an error naming the field (or the damage)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import bundles
from harness.bundles import BundleError


def raw(name: str) -> dict[str, Any]:
    return torch.load(bundles.bundle_path(name), weights_only=True)


def write(tmp_path: Path, d: Any) -> Path:
    path = tmp_path / "bad.pt"
    buf = io.BytesIO()
    torch.save(d, buf)
    path.write_bytes(buf.getvalue())
    return path


def edited(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    d = raw(name)
    edit(d)
    return write(tmp_path, d)


def test_truncated_file(tmp_path: Path) -> None:
    data = bundles.bundle_path("smoke").read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match="not a complete bundle archive \\(truncated"):
        bundles.load(path)


def test_corrupt_bytes(tmp_path: Path) -> None:
    data = bytearray(bundles.bundle_path("smoke").read_bytes())
    q = raw("smoke")["q"].view(torch.int16).numpy().tobytes()
    at = bytes(data).index(q[:64]) + 100  # inside q's stored bytes
    data[at] ^= 0xFF
    path = tmp_path / "flipped.pt"
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="record 'archive/data/\\d+' fails its CRC32 check"):
        bundles.load(path)


def test_wrong_schema_version(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d.update(schema_version=2))
    with pytest.raises(BundleError, match="'schema_version' is 2, this reader handles 1"):
        bundles.load(path)


class NeedsCode:
    def __reduce__(self) -> tuple:
        return (print, ("this would run on load",))


def test_pickle_that_needs_code_is_refused(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d.update(provenance=NeedsCode()))
    with pytest.raises(BundleError, match="refused: loading it needs code to run.*weights_only=True"):
        bundles.load(path)


def test_q_rows_disagree_with_qo_indptr(tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["qo_indptr"] = torch.tensor([0, 3], dtype=torch.int32)

    with pytest.raises(BundleError, match=r"qo_indptr\[-1\] = 3 but q has 4 rows"):
        bundles.load(edited(tmp_path, "smoke", edit))


def test_kv_indices_disagree_with_kv_indptr(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d.update(kv_indices=d["kv_indices"][:-1].clone()))
    with pytest.raises(BundleError, match=r"field 'kv_indices' has shape \[1003\], expected \[1004\]"):
        bundles.load(path)


def test_wrong_dtype(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d.update(q=d["q"].float()))
    with pytest.raises(BundleError, match="field 'q' has dtype torch.float32, expected torch.bfloat16"):
        bundles.load(path)


def test_non_monotonic_indptr(tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["kv_indptr"][2] = d["kv_indptr"][1] - 1

    with pytest.raises(
        BundleError, match=r"kv_indptr is not monotonic: kv_indptr\[2\] = 0 < kv_indptr\[1\] = 1"
    ):
        bundles.load(edited(tmp_path, "ragged", edit))


def test_kv_index_outside_the_pool(tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["kv_indices"][17] = d["shapes"]["pool_slots"]

    slots = raw("smoke")["shapes"]["pool_slots"]
    with pytest.raises(
        BundleError, match=rf"kv_indices\[17\] = {slots} is outside the pool of {slots} slots"
    ):
        bundles.load(edited(tmp_path, "smoke", edit))


def test_tree_parent_after_child(tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["parents"][2] = 3

    with pytest.raises(
        BundleError, match=r"request 0: parents\[2\] = 3 comes after node 2; a parent must precede its child"
    ):
        bundles.load(edited(tmp_path, "smoke", edit))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such bundle file"):
        bundles.load(tmp_path / "absent.pt")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(pool_seed=-1), r"field 'pool_seed' = -1, expected 0 <= seed < 2\*\*32"),
        (
            lambda d: d.update(pool_seed=2**32),
            r"field 'pool_seed' = 4294967296, expected 0 <= seed < 2\*\*32",
        ),
        (
            lambda d: d["goldens"].update(readout_seed=-5),
            r"field 'goldens.readout_seed' = -5, expected 0 <= seed < 2\*\*32",
        ),
        (
            lambda d: d["goldens"].update(readout_seed=2**32),
            r"field 'goldens.readout_seed' = 4294967296, expected 0 <= seed < 2\*\*32",
        ),
    ],
)
def test_a_seed_outside_32_bits(tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(BundleError, match=message):
        bundles.load(edited(tmp_path, "smoke", edit))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_heads", 0, r"field 'shapes.num_heads' = 0, expected >= 1"),
        ("num_requests", 0, r"field 'shapes.num_requests' = 0, expected >= 1"),
        ("pool_slots", 0, r"field 'shapes.pool_slots' = 0, expected 1 <= pool_slots"),
        ("pool_slots", 2**32 // 576 + 1, r"pool_slots \* 576 < 2\*\*32"),
    ],
)
def test_a_count_outside_its_range(tmp_path: Path, key: str, value: int, message: str) -> None:
    with pytest.raises(BundleError, match=message):
        bundles.load(edited(tmp_path, "smoke", lambda d: d["shapes"].update({key: value})))


def test_an_accepted_path_node_outside_the_tree(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d["goldens"].update(accepted_path=[[0, 999]]))
    with pytest.raises(
        BundleError,
        match=r"field 'goldens.accepted_path\[0\]\[1\]' = 999 is outside request 0's tree of 4 nodes",
    ):
        bundles.load(path)


def test_an_accepted_path_the_golden_tokens_do_not_walk(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d["goldens"].update(accepted_path=[[0, 1]]))
    with pytest.raises(
        BundleError,
        match=r"field 'goldens.accepted_path\[0\]' = \[0, 1\], but the golden target tokens walk "
        r"request 0's tree along \[0, 1, 2, 3\]",
    ):
        bundles.load(path)


@pytest.mark.parametrize(("where", "field"), [((), "draft_tokens"), (("goldens",), "target_tokens")])
def test_a_token_outside_the_vocabulary(tmp_path: Path, where: tuple[str, ...], field: str) -> None:
    def edit(d: dict[str, Any]) -> None:
        for key in where:
            d = d[key]
        d[field][2] = 64

    name = ".".join((*where, field))
    with pytest.raises(
        BundleError, match=rf"field '{name}\[2\]' = 64 is not a token, expected 0 <= token < 64"
    ):
        bundles.load(edited(tmp_path, "smoke", edit))


def test_a_missing_field_is_named_once(tmp_path: Path) -> None:
    path = edited(tmp_path, "smoke", lambda d: d.pop("pool_seed"))
    with pytest.raises(BundleError, match=rf"^{re.escape(str(path))}: missing field 'pool_seed'$"):
        bundles.load(path)
