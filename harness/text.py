"""Plain-text tables for the command line (compare's verdicts, the scaling fits) and markdown tables
(the target cases, the trend)."""

from __future__ import annotations

from collections.abc import Sequence


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``header`` in left-aligned columns two spaces apart, a rule of dashes
    between them; trailing spaces dropped."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` under ``header`` as the lines of a markdown table."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(r)} |" for r in rows)]
