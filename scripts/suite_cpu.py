#!/usr/bin/env python3
"""Where a test run's CPU goes: run a command (by default CI's `make test`) and add up the CPU
time of every process the machine ran meanwhile, by kind: vLLM engine cores, rag-stream servers
on vLLM, stub servers, raw vLLM servers, pytest and its xdist workers, the CLIs, the databases,
the browser. On 2 cores a CI run keeps both busy, so its wall time follows its CPU time: this
says what a test costs and what a change saved.

    scripts/suite_cpu.py --out docs/bench/suite-cpu.json                 # make test
    scripts/suite_cpu.py --out /tmp/one.json -- .venv/bin/pytest -q tests/integration/test_x.py

Processes are read from /proc every half second (utime + stime, the last reading of each); a
process that lives less than that is missed, and each loses at most its last half second. The
report gives each kind's CPU seconds during the run (a service running before it counts from
its start), process count and share of the machine's busy time (/proc/stat over the run), and
the 25 processes that used most.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.benchkit import busy_seconds, cmdline, cpu_seconds  # noqa: E402


@dataclass
class Seen:
    kind: str
    cpu_s: float
    first_s: float
    last_s: float
    command: str
    before_s: float = 0.0  # CPU it had used before the run began (a service already running)

    @property
    def run_cpu_s(self) -> float:
        return self.cpu_s - self.before_s


def kind_of(command: str, name: str) -> str:
    """The kind of a process, from its command line and its name (vLLM renames its engine
    core's process ``VLLM::EngineCore`` once started)."""
    if "EngineCore" in name or "EngineCore" in command:
        return "vllm engine core"
    if "xdist" in name or "pytest" in command or "sys.stdin.readline" in command:
        return "pytest and its workers"
    if "vllm.entrypoints" in command:
        return "raw vLLM server"
    if "stub_server" in command:
        return "stub-engine server"
    if "rag_stream serve" in command or "rag-stream serve" in command:
        return "rag-stream serve on vLLM"
    if "multiprocessing" in command and "spawn" in command:
        return "spawned child (engine core while it loads)"
    if "rag_stream" in command or "rag-stream" in command:
        return "rag-stream CLIs and workers"
    for known in ("redis-server", "postgres", "chrom", "node", "schemathesis"):
        if known in name or known in command.split(" ", 1)[0] or known in command:
            return known
    if "python" in name or "python" in command:
        return "other python"
    return "other: " + name


def sample(seen: dict[int, Seen], started: float) -> None:
    now = time.monotonic() - started
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cpu = cpu_seconds(pid)
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            known = seen.get(pid)
            if known is None:
                command = cmdline(pid)
                seen[pid] = Seen(kind_of(command, name), cpu, now, now, command[:160])
            else:
                if "EngineCore" in name:
                    known.kind = "vllm engine core"
                known.cpu_s, known.last_s = cpu, now
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON report")
    parser.add_argument("command", nargs="*", help="what to run (default: make test)")
    args = parser.parse_args()
    command = args.command or ["make", "test"]
    seen: dict[int, Seen] = {}
    me = os.getpid()
    started, busy_before = time.monotonic(), busy_seconds()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            sample(seen, started)
            done.wait(0.5)

    sample(seen, started)
    for process in seen.values():
        process.before_s = process.cpu_s
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    status = subprocess.call(command, cwd=ROOT)
    done.set()
    watcher.join()
    wall_s, busy_s = time.monotonic() - started, busy_seconds() - busy_before
    seen.pop(me, None)
    totals: dict[str, list[float]] = {}
    for process in seen.values():
        if process.run_cpu_s <= 0:
            continue
        total = totals.setdefault(process.kind, [0.0, 0])
        total[0] += process.run_cpu_s
        total[1] += 1
    kinds = sorted(totals.items(), key=lambda item: -item[1][0])
    report = {
        "command": " ".join(command),
        "exit_status": status,
        "wall_s": round(wall_s, 1),
        "busy_cpu_s": round(busy_s, 1),
        "cores": os.cpu_count(),
        "busy_share": round(busy_s / (wall_s * (os.cpu_count() or 1)), 3),
        "kinds": [
            {
                "kind": kind,
                "cpu_s": round(cpu_s, 1),
                "processes": int(count),
                "of_busy": round(cpu_s / busy_s, 3),
            }
            for kind, (cpu_s, count) in kinds
        ],
        "top_processes": [
            {
                "kind": p.kind,
                "cpu_s": round(p.run_cpu_s, 1),
                "from_s": round(p.first_s),
                "to_s": round(p.last_s),
                "command": p.command,
            }
            for p in sorted(seen.values(), key=lambda p: -p.run_cpu_s)[:25]
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{report['wall_s']} s wall, {report['busy_cpu_s']} CPU-s busy ({report['busy_share']:.0%})"
    )
    for row in report["kinds"][:12]:
        print(f"  {row['cpu_s']:8.1f} CPU-s {row['processes']:5d} processes  {row['kind']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
