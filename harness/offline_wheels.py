"""Wheels that bring the SGLang Triton baseline (and nox) to a GPU box without network.

    python -m harness.offline_wheels --dest .whl --strip-binaries

downloads, for CPython 3.12 on manylinux x86_64 by default:

- sglang's wheel without its dependencies (its full dependency set is a whole serving stack,
  torch included);
- the packages that importing sglang's kernel module needs (``KERNEL_IMPORT_DEPS``: sglang's
  package ``__init__`` pulls in its utils, its frontend API and its platform layer) and nox,
  each with its own dependencies, minus what the GPU box already has (``ON_GPU_BOX``) and
  what is declared but never imported there (``NEVER_IMPORTED``).

``--strip-binaries`` repacks sglang's wheel without its compiled server extensions (``*.so``,
about 45 MB unpacked), which the kernel import never loads. Then, on the box (from the
repository root)::

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
    python -c "import sglang.kernels.ops.attention.extend_attention"

The command is also written to ``DEST/INSTALL.txt``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from harness.results import atomic_write_text

SGLANG_VERSION = "0.5.23"
# Imported, directly or through sglang's package __init__, when sglang's extend_attention
# module is imported with torch, triton and numpy present and nothing else (sglang 0.5.23).
KERNEL_IMPORT_DEPS = (
    "aiohttp",
    "ipython",
    "msgspec",
    "orjson",
    "packaging",
    "pillow",
    "psutil",
    "pybase64",
    "pydantic",
    "pyzmq",
    "requests",
    "starlette",
    "tqdm",
)
RUNNER_DEPS = ("nox",)
# Distributions the GPU box has already (torch, triton, numpy, and what torch, matplotlib,
# pandas, jinja2 and pytest depend on): carrying them again would only shadow its versions.
ON_GPU_BOX = frozenset(
    {
        "torch",
        "triton",
        "numpy",
        "typing-extensions",
        "filelock",
        "fsspec",
        "jinja2",
        "markupsafe",
        "networkx",
        "sympy",
        "mpmath",
        "setuptools",
        "packaging",
        "pillow",
        "python-dateutil",
        "six",
    }
)
# Declared dependencies the box never imports: IPython imports jedi (and so parso) only to
# complete code, and nox needs virtualenv only to create a session's virtualenv, which the box,
# without a package index to fill it from, never does (``nox --no-venv``).
NEVER_IMPORTED = frozenset({"jedi", "parso", "virtualenv", "distlib"})
INSTALL_COMMAND = "pip install --no-index --no-deps --target /tmp/site {dest}/*.whl"


def normalise(name: str) -> str:
    """PEP 503 name of a distribution (``Typing_Extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(path: Path) -> str:
    """The normalised distribution name of a wheel file (the part before the first dash)."""
    return normalise(path.name.split("-", 1)[0])


def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_34_x86_64`` and every older manylinux tag a glibc 2.34 system also runs.

    pip does not expand a ``--platform manylinux_2_X`` to older glibc tags itself.
    """
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if m is None:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= glibc]


def pip_download(
    requirements: list[str], dest: Path, python_version: str, platform: str, no_deps: bool
) -> None:
    nodot = python_version.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest)]
    cmd += ["--python-version", python_version, "--implementation", "cp"]
    cmd += ["--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none"]
    for tag in platform_tags(platform):
        cmd += ["--platform", tag]
    if no_deps:
        cmd.append("--no-deps")
    subprocess.run(cmd + requirements, check=True)


def strip_binaries(wheel: Path) -> list[str]:
    """Rewrite ``wheel`` in place without its compiled extensions; returns the names dropped.

    The RECORD loses their lines too, so pip installs the rest with every hash still checked.
    """
    tmp = wheel.with_suffix(".tmp")
    dropped = []
    try:
        with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            infos = zin.infolist()
            dropped = [i.filename for i in infos if re.search(r"\.so(\.[\d.]+)?$", i.filename)]
            for info in infos:
                if info.filename in dropped:
                    continue
                data = zin.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if line.split(",", 1)[0] not in dropped).encode()
                zout.writestr(info, data)
        tmp.replace(wheel)
    finally:
        tmp.unlink(missing_ok=True)
    return dropped


def fetch(dest: Path, python_version: str, platform: str, sglang_version: str, strip: bool) -> list[Path]:
    """Download the wheels into ``dest`` (see the module docstring); returns them, sorted. They are
    downloaded (and stripped) beside it first: a download that fails leaves ``dest``'s earlier
    wheels as they were."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheels-", dir=dest) as tmp:
        stage = Path(tmp) / "download"
        ready = Path(tmp) / "ready"
        ready.mkdir()
        pip_download([f"sglang=={sglang_version}"], stage, python_version, platform, no_deps=True)
        pip_download(list(KERNEL_IMPORT_DEPS + RUNNER_DEPS), stage, python_version, platform, no_deps=False)
        for wheel in sorted(stage.glob("*.whl")):
            if wheel_distribution(wheel) not in ON_GPU_BOX | NEVER_IMPORTED:
                shutil.move(wheel, ready / wheel.name)
        if strip:
            (sglang,) = [w for w in ready.glob("*.whl") if wheel_distribution(w) == "sglang"]
            dropped = strip_binaries(sglang)
            print(f"stripped {len(dropped)} compiled extension(s) from {sglang.name}: {', '.join(dropped)}")
        # every wheel is here: only now the earlier set goes
        for old in dest.glob("*.whl"):
            old.unlink()
        for wheel in sorted(ready.glob("*.whl")):
            os.replace(wheel, dest / wheel.name)
    atomic_write_text(dest / "INSTALL.txt", INSTALL_COMMAND.format(dest=dest.as_posix()) + "\n")
    return sorted(dest.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.offline_wheels", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--dest",
        type=Path,
        default=Path(".whl"),
        help="folder for the wheels (its earlier *.whl replaced once every wheel is downloaded)",
    )
    parser.add_argument("--python-version", default="3.12", help="of the GPU box (default 3.12)")
    parser.add_argument(
        "--platform", default="manylinux_2_34_x86_64", help="newest manylinux tag the box runs"
    )
    parser.add_argument("--sglang-version", default=SGLANG_VERSION)
    parser.add_argument(
        "--strip-binaries",
        action="store_true",
        help="drop sglang's compiled extensions (not used by the kernel)",
    )
    args = parser.parse_args(argv)
    if not str(args.dest) or (args.dest.exists() and not args.dest.is_dir()):
        print(
            f"error: --dest {str(args.dest)!r}: expected a folder for the wheels (created if missing)",
            file=sys.stderr,
        )
        return 2
    try:
        wheels = fetch(
            args.dest, args.python_version, args.platform, args.sglang_version, args.strip_binaries
        )
    except subprocess.CalledProcessError as e:
        print(
            f"error: pip download failed (exit {e.returncode}; its output above says why: the network, or "
            f"no wheel of --sglang-version {args.sglang_version} for Python {args.python_version} on "
            f"{args.platform}); {args.dest}'s earlier wheels are as they were",
            file=sys.stderr,
        )
        return 1
    except OSError as e:
        print(
            f"error: --dest {args.dest}: {e.strerror or e}; its earlier wheels are as they were",
            file=sys.stderr,
        )
        return 1
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
    print(f"{total / 2**20:7.2f} MiB in {len(wheels)} wheels under {args.dest}")
    print("install on the box (from the repository root):")
    print("  " + INSTALL_COMMAND.format(dest=args.dest.as_posix()))
    print("  export PYTHONPATH=/tmp/site")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
