"""Shared test set-up: marker-driven skips and cached bundle fixtures.

- ``gpu`` tests skip, with the reason, where torch sees no CUDA device.
- ``slow`` tests (minutes on a 2-core CPU) run only when selected: ``pytest -m slow``.
- ``bundle(name)`` loads a canonical bundle from bundles/ once per session; ``batch(name)``
  materialises it (CPU), keeping the last two pools (large bundles hold a few hundred MB).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache

import pytest
import torch

from harness import bundles
from harness.batch import VerifyBatch

NO_GPU_REASON = "no CUDA device (torch.cuda.is_available() is False)"
SLOW_REASON = "slow: minutes on a 2-core CPU; select with -m slow"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = not torch.cuda.is_available()
    slow_selected = "slow" in (config.getoption("-m") or "")
    for item in items:
        if no_gpu and "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=NO_GPU_REASON))
        if not slow_selected and "slow" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=SLOW_REASON))


# git's variables that point it at a repository other than the working directory's.
GIT_REPOSITORY_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
)


@pytest.fixture
def own_git_repositories(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that build their own git repositories (and the harness processes they start):
    a caller's git environment, e.g. GIT_DIR set for a run from a source copy, must not send
    their git commands to another repository."""
    for name in GIT_REPOSITORY_ENV:
        monkeypatch.delenv(name, raising=False)


@cache
def _load(name: str) -> bundles.Bundle:
    return bundles.load(name)


@lru_cache(maxsize=2)
def _batch(name: str) -> VerifyBatch:
    return bundles.to_batch(_load(name), "cpu")


@pytest.fixture(scope="session")
def bundle() -> Callable[[str], bundles.Bundle]:
    """``bundle("smoke")``: a canonical bundle, loaded once per session."""
    return _load


@pytest.fixture(scope="session")
def batch() -> Callable[[str], VerifyBatch]:
    """``batch("smoke")``: a canonical bundle's CPU batch with its materialised pool."""
    return _batch
