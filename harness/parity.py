"""Parity: every implementation on every bundle, against the stored float64 goldens.

A run passes for (bundle, implementation) when, on every (token, head) row,

    ||out - ref|| / ||ref|| <= REL_TOL   and   cosine(out, ref) >= COS_TOL,
    |lse - ref_lse| <= LSE_TOL           (where the implementation returns lse; else "not provided"),

the output is finite, and the readout's target tokens and every request's accepted path equal
the golden ones (token-exact, see harness.readout). An implementation that cannot run here is
``unavailable`` with its reason; an exception is an ``error`` and counts as a failure.

``python -m harness parity [--bundles a,b] [--impls x,y] [--device cuda|cpu] [--out DIR]
[--mutations]`` writes results.json + index.html and exits 1 if any available
implementation fails (with ``--mutations``: also if a mutant is never caught or the bf16
control fails), 2 when it cannot run: a bad argument (checked before the run: names, an empty
value, ``--device cuda`` without CUDA, ``--impls`` of which none is available here, an ``--out``
that cannot be written or already holds a run) or a bundle that cannot be used, or when its
report cannot be written.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import mutations, readout
from harness.batch import V_DIM, VerifyBatch
from harness.bundles import CANONICAL, Bundle, BundleError, bundle_path, load, to_batch
from harness.cli import check_run_out_dir, shown
from harness.env import environment, git_info
from harness.materialise import PoolMismatchError
from harness.registry import Implementation, implementations
from harness.results import REPORTS_DIR as REPORTS_DIR  # where runs are written, as before
from harness.results import ParityRow, Results, ResultsError, run_folder
from harness.timing import GpuLockError, gpu_lock_for

REL_TOL = 1e-2
COS_TOL = 0.9999
LSE_TOL = 1e-3


def check(
    bundle: Bundle,
    impl: str,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    run_time_s: float | None = None,
    *,
    returns_lse: bool = False,
) -> ParityRow:
    """The parity row of one implementation's (out, lse) on ``bundle``. ``returns_lse``: the
    implementation is registered as returning lse, so an lse of None fails (its lse check would
    otherwise be skipped unseen); an entry that returns none says so in its row's reason."""
    n, h = bundle.num_tokens, bundle.num_heads
    unusable = (
        f"out is {type(out).__name__}, expected a torch.Tensor [{n}, {h}, {V_DIM}]"
        if not isinstance(out, torch.Tensor)
        else f"out has shape {list(out.shape)}, expected [{n}, {h}, {V_DIM}]"
        if tuple(out.shape) != (n, h, V_DIM)
        else None
    )
    if unusable:
        return ParityRow(bundle=bundle.name, impl=impl, status="fail", reason=unusable, run_time_s=run_time_s)
    got = out.detach().to(device="cpu", dtype=torch.float64)
    ref = bundle.golden_out.to(torch.float64)
    problems = []
    finite = torch.isfinite(got)
    if not bool(finite.all()):
        t, hh, _ = (int(x) for x in torch.nonzero(~finite)[0])
        problems.append(f"non-finite out ({int((~finite).sum())} values, first at token {t}, head {hh})")
    ref_norm = ref.norm(dim=-1)
    rel = (got - ref).norm(dim=-1) / ref_norm
    cos = (got * ref).sum(-1) / (got.norm(dim=-1) * ref_norm)
    rel = torch.nan_to_num(rel, nan=torch.inf, posinf=torch.inf)
    cos = torch.nan_to_num(cos, nan=-1.0)
    worst = int(torch.argmax(rel))
    worst_row = f"token {worst // h}, head {worst % h}"
    max_rel, min_cos = float(rel.max()), float(cos.min())
    if max_rel > REL_TOL:
        problems.append(
            f"rel err {max_rel:.3g} > {REL_TOL} ({int((rel > REL_TOL).sum())} rows, worst {worst_row})"
        )
    if min_cos < COS_TOL:
        problems.append(f"cosine {min_cos:.6f} < {COS_TOL} ({int((cos < COS_TOL).sum())} rows)")

    max_lse = None
    if lse is None and returns_lse:
        problems.append("lse not returned (this implementation is registered as returning it)")
    elif lse is not None and not isinstance(lse, torch.Tensor):
        problems.append(f"lse is {type(lse).__name__}, expected a torch.Tensor [{n}, {h}]")
    elif lse is not None:
        if tuple(lse.shape) != (n, h):
            problems.append(f"lse has shape {list(lse.shape)}, expected [{n}, {h}]")
        else:
            err = (
                lse.detach().to(device="cpu", dtype=torch.float64) - bundle.golden_lse.to(torch.float64)
            ).abs()
            max_lse = float(torch.nan_to_num(err, nan=torch.inf, posinf=torch.inf).max())
            if max_lse > LSE_TOL:
                problems.append(f"lse abs err {max_lse:.3g} > {LSE_TOL}")

    tokens = readout.target_tokens(got.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0), bundle.readout_seed)
    golden_tokens = bundle.target_tokens.numpy()
    tokens_match = bool(np.array_equal(tokens, golden_tokens))
    if not tokens_match:
        wrong = np.nonzero(tokens != golden_tokens)[0]
        problems.append(f"{wrong.size} target tokens differ (first at token {int(wrong[0])})")
    paths = readout.accepted_paths(
        bundle.parents, bundle.qo_indptr.tolist(), bundle.draft_tokens.numpy(), tokens
    )
    path_match = [tuple(p) for p in paths] == list(bundle.accepted_paths)
    if not path_match:
        bad = [b for b, p in enumerate(paths) if tuple(p) != bundle.accepted_paths[b]]
        problems.append(f"accepted path differs in request(s) {bad}")
    return ParityRow(
        bundle=bundle.name,
        impl=impl,
        status="fail" if problems else "pass",
        reason="; ".join(problems)
        or ("" if lse is not None else "lse not provided: output and tokens checked"),
        max_rel_err=max_rel if np.isfinite(max_rel) else None,
        min_cosine=min_cos,
        max_lse_abs_err=max_lse if max_lse is None or np.isfinite(max_lse) else None,
        tokens_match=tokens_match,
        path_match=path_match,
        num_rows=n * h,
        worst_row=worst_row,
        run_time_s=run_time_s,
    )


def run_one(bundle: Bundle, batch: VerifyBatch, impl: Implementation) -> ParityRow:
    """Run ``impl`` on the bundle's batch (availability already checked) and check it."""
    try:
        run = impl.prepare(batch)
        start = time.perf_counter()
        out, lse = run()
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
        elapsed = time.perf_counter() - start
        return check(bundle, impl.name, out, lse, run_time_s=round(elapsed, 4), returns_lse=impl.returns_lse)
    except Exception as e:  # any failure of an implementation is a result, not a crash of the run
        return ParityRow(
            bundle=bundle.name, impl=impl.name, status="error", reason=f"{type(e).__name__}: {e}"
        )


def run_parity(
    bundle_names: Sequence[str],
    impls: Sequence[Implementation],
    device: torch.device,
    log: Callable[[str], object] = print,
) -> tuple[list[ParityRow], list[dict[str, str]]]:
    """Parity rows for every (bundle, implementation), and the unavailable implementations."""
    availability = {impl.name: impl.availability(device) for impl in impls}
    unavailable = [{"impl": name, "reason": reason} for name, (ok, reason) in availability.items() if not ok]
    rows = []
    seen: dict[str, str] = {}  # bundle name -> the --bundles entry that holds it
    loaded = []
    for name in bundle_names:  # every bundle checked before the first runs
        bundle = load(name)
        if seen.setdefault(bundle.name, name) != name:  # two files of one bundle: rows compare refuses
            raise BundleError(
                f"--bundles: {name} holds bundle {bundle.name!r}, as {seen[bundle.name]} does; "
                "expected each bundle once"
            )
        loaded.append((name, bundle))
    for name, bundle in loaded:
        start = time.perf_counter()
        batch = to_batch(bundle, device)
        log(f"{name}: pool materialised and checked in {time.perf_counter() - start:.1f} s")
        for impl in impls:
            ok, reason = availability[impl.name]
            if not ok:
                rows.append(
                    ParityRow(bundle=bundle.name, impl=impl.name, status="unavailable", reason=reason)
                )
                continue
            row = run_one(bundle, batch, impl)
            log(f"  {impl.name:28s} {row.status:5s} {row.reason}")
            rows.append(row)
        del batch  # free this pool before the next bundle's is built
    return rows, unavailable


def default_out_dir(now: datetime, gpu: dict[str, Any] | None, git: dict[str, Any]) -> Path:
    """reports/<UTC yyyymmddTHHMMSS>-parity-<gpu slug or cpu>-<git sha7 or nogit>."""
    return run_folder("parity", gpu["name"] if gpu else None, git.get("sha"), now)


def _split(text: str | None, option: str) -> list[str] | None:
    """A comma-separated option's items, each once in the order given (None when not given: an
    empty value is not "all"); raises ValueError when it names none."""
    if text is None:
        return None
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option} {text!r} names nothing; expected comma-separated names")
    return list(dict.fromkeys(items))


def _select(names: list[str] | None, impls: list[Implementation]) -> list[Implementation]:
    if names is None:
        return impls
    known = {i.name: i for i in impls}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"--impls: unknown implementation(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return [known[n] for n in names]


def _bundle_names(text: str | None) -> list[str]:
    """``--bundles``: canonical names or bundle files (default: every canonical bundle)."""
    names = _split(text, "--bundles") or list(CANONICAL)
    missing = [n for n in names if n not in CANONICAL and not bundle_path(n).is_file()]
    if missing:
        raise ValueError(
            f"--bundles: {', '.join(missing)}: neither a canonical bundle ({', '.join(CANONICAL)}) "
            "nor a bundle file"
        )
    # A name and the file it stands for (smoke, bundles/smoke.pt) are one bundle: checked once.
    once: dict[Path, str] = {}
    for n in names:
        once.setdefault(bundle_path(n).resolve(), n)
    return list(once.values())


def nothing_available(impls: Sequence[Implementation], device: torch.device) -> None:
    """ValueError when not one of the implementations ``--impls`` names can run on ``device``: the
    run would check nothing, and pass."""
    reasons = []
    for impl in impls:
        ok, reason = impl.availability(device)
        if ok:
            return
        reasons.append(f"{impl.name}: {reason}")
    raise ValueError(
        f"--impls: no implementation named is available on {device.type} ({'; '.join(reasons)}); "
        "nothing would be checked"
    )


def _device(name: str | None) -> torch.device:
    """``--device`` (default: cuda when available, else cpu); raises ValueError for cuda without CUDA."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible to torch (use --device cpu)")
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def print_table(rows: Sequence[ParityRow]) -> None:
    def fmt(x: float | None, spec: str) -> str:
        return f"{'-':>9s}" if x is None else format(x, spec)  # every spec here is 9 wide

    print(
        f"{'bundle':18s} {'implementation':28s} {'status':11s} {'max rel':>9s} {'min cos':>9s} {'lse err':>9s} tokens path"
    )
    for r in rows:
        tokens = "-" if r.tokens_match is None else ("ok" if r.tokens_match else "DIFF")
        path = "-" if r.path_match is None else ("ok" if r.path_match else "DIFF")
        lse = (
            "n/a"
            if r.status in ("pass", "fail") and r.max_lse_abs_err is None
            else fmt(r.max_lse_abs_err, "9.2e")
        )
        print(
            f"{r.bundle:18s} {r.impl:28s} {r.status:11s} {fmt(r.max_rel_err, '9.2e')} "
            f"{fmt(r.min_cosine, '9.6f')} {lse:>9s} {tokens:6s} {path}"
        )


def verdict(rows: Sequence[ParityRow], with_mutations: bool) -> tuple[int, list[str]]:
    """(exit code, notes): 1 if a registered implementation fails or errors, or (with mutations)
    a mutant is never caught or the bf16 control fails anywhere."""
    notes = []
    failed = sorted(
        {
            r.impl
            for r in rows
            if r.status in ("fail", "error") and not r.impl.startswith(("mutant:", "control:"))
        }
    )
    if failed:
        notes.append(f"failing implementations: {', '.join(failed)}")
    if with_mutations:
        by_mutant: dict[str, list[ParityRow]] = {}
        for r in rows:
            if r.impl.startswith("mutant:"):
                by_mutant.setdefault(r.impl, []).append(r)
        uncaught = sorted(m for m, rs in by_mutant.items() if not any(r.status == "fail" for r in rs))
        if uncaught:
            notes.append(f"mutants parity did not catch on any bundle: {', '.join(uncaught)}")
        else:
            notes.append(f"all {len(by_mutant)} mutants caught (each fails parity on at least one bundle)")
        control_bad = sorted({r.bundle for r in rows if r.impl.startswith("control:") and r.status != "pass"})
        if control_bad:
            notes.append(f"the bf16-rounded oracle control failed on: {', '.join(control_bad)}")
        failed += uncaught + control_bad
    return (1 if failed else 0), notes


def command_args(args: argparse.Namespace) -> list[str]:
    """The run's options as a command line, from the parsed arguments rather than the typed words
    (an abbreviated ``--bund`` reads as ``--bundles``): ``results.json`` records it, and compare
    keys a narrowed run (``--bundles``, ``--impls``) apart by it."""
    out = []
    for option, value in (("--bundles", args.bundles), ("--impls", args.impls), ("--device", args.device)):
        if value:
            out += [option, value]
    return [*out, "--mutations"] if args.mutations else out


def _cmd_parity(args: argparse.Namespace) -> int:
    from harness.report import write_run

    # Every argument is checked before the run, so that a bad one costs no parity run (exit 2).
    try:
        device = _device(args.device)
        names = _bundle_names(args.bundles)
        impls = _select(_split(args.impls, "--impls"), implementations())
        out = check_run_out_dir(args.out, REPORTS_DIR)
        if args.impls is not None:
            nothing_available(impls, device)
    except ValueError as e:
        print(f"parity: {e}", file=sys.stderr)
        return 2
    # The command records the selection as run: each name once (compare keys a run on it).
    recorded = argparse.Namespace(
        **{
            **vars(args),
            "bundles": None if args.bundles is None else ",".join(names),
            "impls": None if args.impls is None else ",".join(i.name for i in impls),
        }
    )
    if args.mutations:
        impls = [*impls, mutations.control(), *mutations.mutants()]
    now = datetime.now(timezone.utc)
    try:
        # One GPU-holding process at a time: parity shares the lock with timed sweeps.
        with gpu_lock_for(device):
            rows, unavailable = run_parity(names, impls, device)
    except (BundleError, PoolMismatchError, GpuLockError) as e:
        print(f"parity: {e}", file=sys.stderr)
        return 2
    code, notes = verdict(rows, args.mutations)
    env, git = environment(device), git_info()
    results = Results(
        kind="parity",
        created_utc=now.isoformat(timespec="seconds"),
        command=shlex.join(["python", "-m", "harness", "parity", *command_args(recorded)]),
        git=git,
        environment=env,
        parity=rows,
        unavailable=unavailable,
        notes=notes,
    )
    out_dir = out or default_out_dir(now, env["gpu"], git)
    try:
        write_run(results, out_dir)
    except (ResultsError, OSError) as e:
        print(f"parity: the report could not be written: {e}", file=sys.stderr)
        return 2  # 1 says an implementation failed
    print_table(rows)
    for item in unavailable:
        print(f"unavailable: {item['impl']}: {item['reason']}")
    for r in rows:
        if r.status in ("fail", "error") and not r.impl.startswith("mutant:"):
            print(f"{r.status}: {r.impl} on {r.bundle}: {r.reason}")
    for note in notes:
        print(note)
    print(f"wrote {shown(out_dir)}")
    return code


def register_cli(sub: Any) -> None:
    parser = sub.add_parser("parity", help="every implementation on the bundles against the float64 goldens")
    parser.add_argument("--bundles", help=f"comma-separated bundle names (default: {','.join(CANONICAL)})")
    parser.add_argument("--impls", help="comma-separated implementations (default: every registered one)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available, else cpu")
    parser.add_argument("--out", help="output folder (default: reports/<time>-parity-<gpu>-<sha7>/)")
    parser.add_argument(
        "--mutations",
        action="store_true",
        help="also run the mutation controls (mutant:* rows, expected to fail)",
    )
    parser.set_defaults(func=_cmd_parity)
