"""Shared by the benchmark scripts: medians with spreads, and a process's own CPU time."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads, none of its children), from
    /proc/PID/stat: fields 14 and 15 of the line, counted after the command's closing
    parenthesis (a command may hold spaces)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


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
