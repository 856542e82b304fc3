"""Shared by the benchmark scripts: medians with spreads."""

from __future__ import annotations

import statistics


def summary(values: list[float], digits: int = 1) -> dict[str, float]:
    """p50, p99 (nearest rank), min, max and n of some measurements."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered), digits),
        "p99": round(p99, digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "n": len(ordered),
    }
