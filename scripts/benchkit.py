"""What the benchmark scripts share: the servers they measure, rounds that alternate, medians
with spreads, and the report.

Imported as ``scripts.benchkit``, once a script has put the repository on ``sys.path``.

Servers. ``start_rag_stream`` launches ``rag-stream serve`` (or another command running the app:
the test suite's stub server, ``STUB_SERVER``) on a free port as a ``ServerProcess``
(tests/support/server.py) and returns at once, so several can load side by side; each is then
waited for with ``wait_ready``. ``start_raw_vllm`` launches vLLM's own OpenAI server with the
engine arguments ``engine_env`` gives rag-stream's in-process engine; it has no ``/readyz``, so
``wait_health`` polls its ``/health``. ``private_redis`` is a redis-server of the run's own.

Rounds. ``alternate`` gives the compared sides in order in even rounds and reversed in odd ones:
each goes first as often, and a load that drifts during the run falls on all of them.

Statistics. ``summary`` is the median (p50), p99, min, max and n of some measurements;
``across`` the same of the values that were measured (None: not measured); ``percentile`` is
the nearest-rank one ``summary`` uses; ``cell`` shows a summary as "median (min–max)".

Report. ``command`` is the command line to paste to run it again; ``write_json`` writes a report;
``Conditions`` records what else the machine did meanwhile, ``log_errors`` what a server logged
that went wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from tests.support.redis_server import RedisServer
from tests.support.server import ROOT, ServerProcess, free_port

T = TypeVar("T")
TICK = os.sysconf("SC_CLK_TCK")

# -- servers --------------------------------------------------------------------------------

MODELS = ROOT / ".data" / "models"
MODEL = MODELS / "SmolLM2-135M-Instruct"
STUB_SERVER = [sys.executable, "-m", "tests.support.stub_server"]
# The engine the real-engine comparisons run, in rag-stream and behind vLLM's own server alike:
# SmolLM2 float32, prefix caching, enforce_eager, seed 0, one token a step (no speculative
# decoding: rag-stream's default has it, vLLM's server does not), and these.
MAX_MODEL_LEN, MAX_NUM_SEQS, KV_GB = 4096, 32, 1.0
RAW_SERVED = "smol"  # the model's name on the raw vLLM server


def engine_env() -> dict[str, str]:
    """rag-stream's settings for that engine (the rest are its default profile's)."""
    return {
        "RAG_STREAM_DTYPE": "float32",
        "RAG_STREAM_ENGINE__MAX_NUM_SEQS": str(MAX_NUM_SEQS),
        "RAG_STREAM_ENGINE__MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "RAG_STREAM_ENGINE__KV_CACHE_GB": str(KV_GB),
        "RAG_STREAM_ENGINE__SPECULATIVE": "off",
    }


def start_rag_stream(
    data: Path,
    env: Mapping[str, str] | None = None,
    *,
    profile: str = "default",
    argv: list[str] | None = None,
    port: int | None = None,
) -> ServerProcess:
    """``rag-stream serve`` (or ``argv``) with its data folder and log in ``data``, no sample
    KB, warnings only; ``env`` adds to that or overrides it. Not waited for."""
    data.mkdir(parents=True, exist_ok=True)
    base = {
        "RAG_STREAM_PROFILE": profile,
        "RAG_STREAM_DATA_DIR": str(data),
        "RAG_STREAM_MODELS_DIR": str(MODELS),
        "RAG_STREAM_INGEST__SAMPLE_KB": "false",
        "RAG_STREAM_LOG_LEVEL": "warning",
    }
    return ServerProcess({**base, **(env or {})}, data / "server.log", port, argv)


def start_raw_vllm(log: Path) -> ServerProcess:
    """``python -m vllm.entrypoints.openai.api_server`` on the engine of ``engine_env``, the
    model served as ``RAW_SERVED``. Not waited for: ``wait_health``."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(MODEL), "--served-model-name", RAW_SERVED, "--dtype", "float32"),
        *("--enable-prefix-caching", "--enforce-eager", "--seed", "0"),
        *("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS)),
        *("--kv-cache-memory-bytes", str(int(KV_GB * (1 << 30)))),
        *("--gpu-memory-utilization", "0.3"),  # as rag_stream/generation/vllm_engine.py
        *("--disable-uvicorn-access-log", "--port", str(port), "--host", "127.0.0.1"),
    ]  # fmt: skip
    return ServerProcess({}, log, port=port, command=command)


def wait_health(server: ServerProcess, timeout_s: float = 600) -> None:
    """Until a server without ``/readyz`` (vLLM's) answers ``/health``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy after {timeout_s} s:\n{server.log_tail()}")


@contextlib.contextmanager
def private_redis(folder: Path, *, unix_socket: bool = False) -> Iterator[RedisServer]:
    """A redis-server of this run's own on a free port (and, with ``unix_socket``, on a socket
    in ``folder``), answering PING, keeping nothing."""
    redis = RedisServer(folder, unix_socket=unix_socket)
    redis.start()
    try:
        yield redis
    finally:
        redis.kill()


# -- prompts --------------------------------------------------------------------------------

TOPICS = (
    "volcanoes", "tides", "photosynthesis", "the printing press", "honeybees", "glaciers",
    "compound interest", "the Roman aqueducts", "jet engines", "coral reefs", "vaccines",
    "the water cycle", "black holes", "sourdough bread", "the Silk Road", "solar panels",
    "migratory birds", "the stock market", "earthquakes", "chess openings", "rainforests",
    "the human heart", "lighthouses", "electric cars", "the Moon's phases", "coffee roasting",
    "recycling plastics", "the Great Wall", "hurricanes", "octopuses", "wind turbines",
    "the immune system", "maps and compasses", "deserts", "the violin", "public libraries",
    "bridges", "penguins", "the internet", "tea ceremonies",
)  # fmt: skip
TEMPLATES = (
    "Explain {} to a curious ten-year-old.",
    "Give three surprising facts about {}.",
    "Write a short paragraph on why {} matter to everyday life.",
    "What are the most common misconceptions about {}?",
    "Describe how {} work, step by step.",
)


def question(c: int, rnd: int, i: int) -> str:
    """A chat prompt never used before in the run: the nonce comes first, so nothing past the
    chat template's system part is ever a cached prefix."""
    topic = TOPICS[(7 * i + 3 * rnd + c) % len(TOPICS)]
    return f"Request {c}-{rnd}-{i}. " + TEMPLATES[(i + rnd) % len(TEMPLATES)].format(topic)


# -- rounds and statistics ------------------------------------------------------------------


def alternate(sides: Sequence[T], rnd: int) -> list[T]:
    """The order of round ``rnd``: ``sides`` as given in even rounds, reversed in odd ones."""
    return list(sides) if rnd % 2 == 0 else list(sides)[::-1]


def percentile(values: Iterable[float], q: float) -> float:
    """The measurement nearest to rank q·(n−1) of the sorted values (numpy's "nearest")."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: Iterable[float], digits: int = 1) -> dict[str, float]:
    """p50 (the median), p99, min, max and n of some measurements."""
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), digits),
        "p99": round(percentile(ordered, 0.99), digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "n": len(ordered),
    }


def across(values: Iterable[float | None], digits: int = 1) -> dict[str, float]:
    """``summary`` of the values that were measured; {} when none was."""
    kept = [v for v in values if v is not None]
    return summary(kept, digits) if kept else {}


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a and b else None


def cell(s: Mapping[str, float] | None, fmt: str = "g") -> str:
    """A summary in a Markdown table: "median (min–max)", the median alone for one round."""
    if not s:
        return "–"
    mid = format(s["p50"], fmt)
    return mid if s["n"] == 1 else f"{mid} ({format(s['min'], fmt)}–{format(s['max'], fmt)})"


# -- CPU time -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads, none of its children), from
    /proc/PID/stat: fields 14 and 15 of the line, counted after the command's closing
    parenthesis (a command may hold spaces)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(root: int) -> set[int]:
    """``root`` and its living descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()


def tree_cpu_seconds(root: int) -> float:
    """``cpu_seconds`` of ``root`` and its living descendants (one that just ended: none)."""
    total = 0.0
    for pid in tree(root):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(pid)
    return total


# -- the report -----------------------------------------------------------------------------


def command() -> str:
    """This run's command line, as it is run again from the repository."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([".venv/bin/python", shown.as_posix(), *sys.argv[1:]])


def write_json(path: Path, report: Mapping[str, Any], indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
    }


def log_errors(log: Path, limit: int = 20) -> list[str]:
    """A server log's error and traceback lines (the first ``limit``, cut at 300 characters)."""
    if not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    found = [line[:300] for line in lines if re.search(r"\b(ERROR|Traceback|CRITICAL)\b", line)]
    return found[:limit]


def busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICK


def others() -> list[str]:
    """Heavy processes that are not this run's (vLLM engines, servers, test runs)."""
    mine = tree(os.getpid())
    pattern = re.compile(r"vllm|rag_stream|rag-stream|pytest|redis-server|EngineCore")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if cmd and pattern.search(cmd):
                found.append(f"{entry.name} {cmd[:120]}")
    return sorted(found)


class Conditions:
    """What else the machine did from now on: CPU time spent outside this process's tree (the
    machine's busy time less ours), and the heavy processes that were not ours."""

    def __init__(self) -> None:
        self.others_start = others()
        self._busy0, self._ours0 = busy_seconds(), tree_cpu_seconds(os.getpid())
        self._wall0 = time.perf_counter()

    def report(self, loadavgs: list[float]) -> dict[str, Any]:
        """Taken while the servers still run: their CPU is ours, the rest of the machine's is
        not. ``loadavgs``: the 1-minute load average before each measured run."""
        wall = time.perf_counter() - self._wall0
        ours = tree_cpu_seconds(os.getpid()) - self._ours0
        foreign = max(0.0, busy_seconds() - self._busy0 - ours)
        return {
            "wall_s": round(wall, 1),
            "foreign_cpu_s": round(foreign, 1),
            "foreign_cores": round(foreign / wall, 2),
            "loadavg_1m_before_runs": loadavgs,
            "others_start": self.others_start,
            "others_end": others(),
        }
