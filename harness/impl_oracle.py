"""Registry entry for the float64 reference ("oracle"): runs wherever the batch is."""

from __future__ import annotations

import torch

from harness.batch import VerifyBatch
from harness.oracle import reference
from harness.registry import Implementation, RunFn, register

NAME = "oracle"


def _availability(device: torch.device) -> tuple[bool, str]:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, ""


def prepare(batch: VerifyBatch) -> RunFn:
    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        return reference(batch)

    return run


register(
    Implementation(
        name=NAME,
        description="float64 reference on the batch's device (naive: chunked prefix, explicit mask)",
        availability=_availability,
        prepare=prepare,
        device_kind="any",
        is_reference=True,
    )
)
