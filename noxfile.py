"""nox sessions: parity, sweep, compare, ab, bringup, tests (which runs the ptxas check), lint.

Every session also runs with ``nox --no-venv -s NAME`` on a box whose CUDA torch is already
installed (nothing is installed then; the packages must be there). With a virtualenv the
session inherits the system site-packages, so a preinstalled CUDA torch is reused instead of
pulling another build.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

VENV_PARAMS = ["--system-site-packages"]


def _has_venv(session: nox.Session) -> bool:
    return not isinstance(session.virtualenv, nox.virtualenv.PassthroughEnv)


def _install_project(session: nox.Session, extras: str = "") -> None:
    if _has_venv(session):
        session.install("-e", f".{extras}")


# After Ctrl-C, how long a command has to stop its children and write its record before nox
# sends SIGTERM (nox's default, 0.3 s, is less than a bring-up's step or a sweep's workers need).
INTERRUPT_TIMEOUT_S = 60.0


def _harness(session: nox.Session, *args: str) -> None:
    session.run("python", "-m", "harness", *args, interrupt_timeout=INTERRUPT_TIMEOUT_S)


@nox.session(venv_params=VENV_PARAMS)
def parity(session: nox.Session) -> None:
    """Parity of every available implementation on the six bundles; writes reports/<run>/."""
    _install_project(session)
    _harness(session, "parity", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def sweep(session: nox.Session) -> None:
    """Timed sweep over a grid (``-- --grid quick|default|full|sm120``); writes reports/<run>/."""
    _install_project(session)
    _harness(session, "sweep", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def compare(session: nox.Session) -> None:
    """``nox -s compare -- BASE HEAD``: verdicts per case; exit 1 on SLOWER or a parity regression."""
    _install_project(session)
    _harness(session, "compare", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def ab(session: nox.Session) -> None:
    """``nox -s ab -- --base REV``: builds REV's kernel beside this one, times both interleaved."""
    _install_project(session)
    _harness(session, "ab", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def bringup(session: nox.Session) -> None:
    """The first run on a new box: GPU tests, parity, sweeps, mma.sync's ceiling, A/Bs, TP; writes
    reports/<run>-bringup-.../ (``-- --list`` shows the steps)."""
    _install_project(session, "[dev]")
    _harness(session, "bringup", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def tests(session: nox.Session) -> None:
    """CPU tests (GPU tests skip with their reason), the sm_90/sm_120 ptxas resource check, and the
    regression gate over the committed report history (newest two runs per GPU model, kind and grid)."""
    _install_project(session, "[dev]")
    session.run("python", "-m", "kernel.ptxas_check")
    # Gate on the project's kernel, every entry of it (`auto` and sm_120's configs forced); the
    # reference implementations' drift between boards is shown, not counted (harness/compare.py,
    # "Gated implementations").
    _harness(session, "compare", "--history", "reports/", "--gate-impls", "verify-attn-cuda*")
    if not session.posargs:  # the large bundles (4-6): regeneration, goldens, controls, ~2 minutes
        session.run("python", "-m", "pytest", "-q", "-m", "slow")
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]))


@nox.session(venv_params=VENV_PARAMS)
def lint(session: nox.Session) -> None:
    if _has_venv(session):
        session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
