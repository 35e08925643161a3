"""The GPU fuzz's size and seeds, from the environment (tests/test_kernel_gpu.py).

``VERIFY_ATTN_FUZZ_CASES`` (default 160) random batches a config, and ``VERIFY_ATTN_FUZZ_SEED``
(default 0: the suite's own seeds) to draw other batches: a soak after a kernel change, e.g.
``VERIFY_ATTN_FUZZ_SEED=7 VERIFY_ATTN_FUZZ_CASES=1000 pytest -m gpu -k fuzz``. A failing case's
message names both, so it can be drawn again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CASES_VAR, SEED_VAR = "VERIFY_ATTN_FUZZ_CASES", "VERIFY_ATTN_FUZZ_SEED"
DEFAULT_CASES = 160
# Each config's own draws at offset 0 (the suite's seeds since the fuzz was written).
CONFIG_SEEDS = {
    "auto": 1234,
    "wgmma-ws": 2468,
    "wgmma-ws-pipe": 9753,
    "wgmma": 5678,
    "large": 8765,
    "small": 4321,
    "small-m32": 3579,
}
# Apart enough that seed offsets 0, 1, 2, ... never give two configs the same draws.
SEED_STRIDE = 1_000_003


def _int(environ: Mapping[str, str], name: str, default: int, low: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a whole number >= {low}") from None
    if value < low:
        raise ValueError(f"{name}={value}: expected a whole number >= {low}")
    return value


def fuzz_settings(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(cases a config, seed offset); ValueError naming the variable for a value that is not a
    whole number in range (cases >= 1, seed >= 0)."""
    return _int(environ, CASES_VAR, DEFAULT_CASES, 1), _int(environ, SEED_VAR, 0, 0)


def fuzz_seed(base: int, offset: int) -> int:
    """The seed of a config's draws: its own ``base`` at offset 0, as the suite always had."""
    return base + SEED_STRIDE * offset
