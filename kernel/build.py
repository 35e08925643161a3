"""JIT build of the CUDA extension (torch.utils.cpp_extension + ninja), cached by source hash.

The module name carries a hash of the sources, the target archs and the flags, so two
revisions of the kernel (an A/B run) or two arch lists never share a build. Builds land in
``$VERIFY_ATTN_BUILD_DIR/<name>`` (default ``~/.cache/verify-attention/<name>``).

Tuning builds: ``$VERIFY_ATTN_EXTRA_CUDA_FLAGS`` (e.g. ``-DVA_WS_BLOCK_N=32``) is appended to the nvcc
flags and is part of the hash, so variants coexist. ``EXTRA_CUDA_FLAGS`` below is appended after it:
``python -m harness ab --base-define NAME`` sets it (``-DNAME``) on a second copy of this package,
so that one process times two builds of the same sources.

Target archs: ``$VERIFY_ATTN_ARCHS`` (e.g. ``"9.0;12.0"``), else the current GPU's compute
capability. Compute capability 9.0 is built as ``9.0a`` (the arch-specific target that has wgmma):
an sm_90a binary runs on exactly the GPUs an sm_90 one does (H100/H200), and the build then
defines ``VA_HAVE_SM90A`` so the launcher may pick the wgmma kernel. ``python -m kernel.ptxas_check``
compiles the kernels for sm_90a and sm_120 on any machine with nvcc, without a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import IO

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("binding.cpp", "verify_attention.cu")
HEADERS = (
    "verify_attention.cuh",
    "verify_attention_sm90.cuh",
    "verify_attention.h",
    "messages.h",
    "checks.h",
)
CUDA_FLAGS = ("-O3", "-std=c++17", "--use_fast_math", "-lineinfo")
CXX_FLAGS = ("-O3", "-std=c++17")

# Appended to the nvcc flags after $VERIFY_ATTN_EXTRA_CUDA_FLAGS (a second, renamed copy of this
# package gets its own; see the module docstring). Set it before the first build.
EXTRA_CUDA_FLAGS: tuple[str, ...] = ()

_loaded: ModuleType | None = None
_loaded_build: dict[str, object] | None = None  # archs and nvcc flags of the loaded extension


def target_archs() -> str:
    env = os.environ.get("VERIFY_ATTN_ARCHS")
    if env:
        return with_sm90a(env)
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA device to build for: set VERIFY_ATTN_ARCHS (e.g. '9.0;12.0') to build without one"
        )
    major, minor = torch.cuda.get_device_capability()
    return with_sm90a(f"{major}.{minor}")


ARCH_ENTRY = re.compile(r"\d+\.\d+a?(\+PTX)?")


def with_sm90a(archs: str) -> str:
    """``9.0`` -> ``9.0a`` in an arch list (entries separated by ``;`` or spaces, as torch reads
    ``TORCH_CUDA_ARCH_LIST``; other entries unchanged), returned ``;``-separated. Entries must be
    compute capabilities (``X.Y``, ``X.Ya``, optionally ``+PTX``): torch's names (``Hopper``) would
    build sm_90 without the ``a`` that wgmma needs, so they are refused, naming the variable."""
    entries = [a for a in re.split(r"[;\s]+", archs) if a]
    bad = [a for a in entries if not ARCH_ENTRY.fullmatch(a)]
    if bad or not entries:
        raise ValueError(
            f"VERIFY_ATTN_ARCHS = {archs!r}: expected compute capabilities such as '9.0;12.0' "
            f"(X.Y, X.Ya, optionally +PTX), got {', '.join(map(repr, bad)) or 'none'}"
        )
    return ";".join("9.0a" if a == "9.0" else a for a in entries)


def has_sm90a(archs: str) -> bool:
    """Whether the arch list builds sm_90a code (``9.0a``, or ``9.0a+PTX``): the wgmma kernels."""
    return any(a.split("+")[0] == "9.0a" for a in archs.split(";"))


def cuda_flags(archs: str) -> tuple[str, ...]:
    extra = ("-DVA_HAVE_SM90A",) if has_sm90a(archs) else ()
    env = tuple(os.environ.get("VERIFY_ATTN_EXTRA_CUDA_FLAGS", "").split())
    return CUDA_FLAGS + extra + env + tuple(EXTRA_CUDA_FLAGS)


def source_hash(archs: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(archs.encode())
    h.update(" ".join(cuda_flags(archs) + CXX_FLAGS).encode())
    return h.hexdigest()[:16]


def build_dir(name: str) -> Path:
    return Path(os.environ.get("VERIFY_ATTN_BUILD_DIR", Path.home() / ".cache" / "verify-attention")) / name


# torch's build lock (``<build dir>/lock``) has no timeout and records no owner: a build killed
# mid-way (a bring-up step's timeout, a test's, Ctrl-C) leaves it, and every later build would
# wait for it silently, forever. So every build of this package first takes an advisory lock of
# its own in the same directory (``build.flock``, flock(2)), which the OS releases when its holder
# dies: while holding it, no live build of this package is running there, and a torch lock found
# then is a dead build's, removed at once. A process waiting for a live build waits up to
# LOCK_WAIT_S. Where flock(2) is missing (not POSIX, or a file system without it), a torch lock
# older than STALE_LOCK_S is taken for a dead build's instead. A build takes 30 s to 2 minutes
# (by the host's cores); loading a cached one takes the lock for a moment.
STALE_LOCK_S = 30 * 60
LOCK_WAIT_S = 15 * 60
LOCK_POLL_S = 1.0
OWN_LOCK = "build.flock"
TORCH_LOCK = "lock"  # torch.utils.cpp_extension's, in the same directory

try:
    import fcntl
except ImportError:  # not POSIX: the age rule below
    fcntl = None


def _wait_until(ready: Callable[[], bool], wait_s: float, waiting: str, timed_out: str) -> None:
    """Poll ``ready`` every LOCK_POLL_S until it is true; print ``waiting`` once if it is not at
    first, and raise RuntimeError(``timed_out``) once ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    said = False
    while not ready():
        if time.monotonic() >= deadline:
            raise RuntimeError(timed_out)
        if not said:
            print(f"verify-attention: {waiting}", file=sys.stderr)
            said = True
        time.sleep(LOCK_POLL_S)


def wait_for_build_lock(
    directory: Path, *, stale_s: float = STALE_LOCK_S, wait_s: float = LOCK_WAIT_S
) -> None:
    """Where flock(2) is missing, before a build in ``directory``: remove torch's lock file if it is
    older than ``stale_s`` (a killed build's), else wait up to ``wait_s`` for another process's
    build to release it, saying so once; RuntimeError naming the lock if it is still held then."""
    lock = directory / TORCH_LOCK

    def free() -> bool:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return True
        if age <= stale_s:
            return False
        print(f"verify-attention: removing {lock}, a build lock {age / 60:.0f} minutes old", file=sys.stderr)
        lock.unlink(missing_ok=True)
        return True

    _wait_until(
        free,
        wait_s,
        f"waiting for another build to release {lock}",
        f"{lock} is still held after {wait_s:.0f} s: another process is building the extension "
        "there, or a build was killed; remove the file if no build is running",
    )


def _try_flock(fh: IO[str]) -> bool:
    """Take an exclusive flock(2) on ``fh`` if no other process holds one; OSError where the file
    system has no flock."""
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def build_lock(directory: Path, *, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold this package's build lock on ``directory`` for the body: wait up to ``wait_s`` for a
    live build of another process to end (saying so once; RuntimeError naming the directory if it
    has not), then remove torch's lock file if a dead build left one (saying so)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / OWN_LOCK, "a") as fh:
        try:
            flocked = fcntl is not None
            if flocked:
                _wait_until(
                    lambda: _try_flock(fh),
                    wait_s,
                    f"waiting for another process's build in {directory}",
                    f"another process has been building the extension in {directory} for over "
                    f"{wait_s:.0f} s (it holds {directory / OWN_LOCK}); let it finish or stop it",
                )
        except OSError:  # a file system without flock(2) (some network mounts)
            flocked = False
        if not flocked:  # the age rule
            wait_for_build_lock(directory, wait_s=wait_s)
            yield
            return
        try:
            stale = directory / TORCH_LOCK
            if stale.exists():
                print(
                    f"verify-attention: removing {stale}, left by a build that did not finish",
                    file=sys.stderr,
                )
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def load_cuda_extension(
    name: str,
    sources: list[Path],
    archs: str,
    cuda_cflags: list[str],
    cflags: list[str] | None = None,
    verbose: bool = False,
) -> ModuleType:
    """Build or load a torch CUDA extension for ``archs`` (``TORCH_CUDA_ARCH_LIST`` is set for the
    build only), with the kernel headers on the include path, cached under ``build_dir(name)``."""
    from torch.utils import cpp_extension

    directory = build_dir(name)
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    try:
        with build_lock(directory):
            return cpp_extension.load(
                name=name,
                sources=[str(s) for s in sources],
                extra_cflags=list(cflags or ()),
                extra_cuda_cflags=cuda_cflags,
                extra_include_paths=[str(CSRC)],
                build_directory=str(directory),
                verbose=verbose,
            )
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


def load_extension(verbose: bool = False) -> ModuleType:
    """Build (first call, 30 s to 2 minutes) or load the cached extension module."""
    global _loaded, _loaded_build
    if _loaded is not None:
        return _loaded
    archs = target_archs()
    flags = list(cuda_flags(archs))
    _loaded = load_cuda_extension(
        f"verify_attention_{source_hash(archs)}",
        [CSRC / s for s in SOURCES],
        archs,
        flags,
        list(CXX_FLAGS),
        verbose,
    )
    _loaded_build = {"target_archs": archs, "cuda_flags": flags, "tuning": tuning()}
    return _loaded


def tuning() -> list[str]:
    """What makes this build other than the default one for its GPU: the nvcc flags added by
    ``$VERIFY_ATTN_EXTRA_CUDA_FLAGS`` or ``EXTRA_CUDA_FLAGS``, and an arch list set by
    ``$VERIFY_ATTN_ARCHS`` (empty for a default build). Runs of such builds are compared only with
    their like (harness/compare.py)."""
    extra = [*os.environ.get("VERIFY_ATTN_EXTRA_CUDA_FLAGS", "").split(), *EXTRA_CUDA_FLAGS]
    env = os.environ.get("VERIFY_ATTN_ARCHS")
    if not env:
        return extra
    archs = with_sm90a(env)
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if archs == with_sm90a(f"{major}.{minor}"):  # what the build picks for this GPU anyway
            return extra
    return [*extra, f"VERIFY_ATTN_ARCHS={archs}"]


def loaded_build() -> dict[str, object] | None:
    """The archs and nvcc flags the loaded extension was built with; None before a load."""
    return None if _loaded_build is None else dict(_loaded_build)


def loaded_extension() -> ModuleType | None:
    """The extension if this process has built or loaded it, else None (never builds)."""
    return _loaded
