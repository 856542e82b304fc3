"""test_jobs.py's two SmolLM2 servers: KV snapshots on, sharing Redis (events and blocks) and a
PostgreSQL database of their own; the KB ingested once (SQL + the victim's vector store) and the
survivor's vector store rebuilt from SQL. Started by a session fixture
(tests/support/session_servers.py) a module ahead of their own (``START_AHEAD``), so that their
engines start while that module works."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.redis_keys import drop_keys
from tests.support.server import ROOT, ServerProcess

KB = "lore"
DOCS = {
    "skerry.md": "# The Skerry lighthouse\n\nThe Skerry lighthouse was built in 1872 on a granite "
    "reef off the coast of Vell. Its lamp burned whale oil until 1905, then paraffin.\n\n"
    "## Keepers\n\nThree keepers lived at Skerry in rotation: two on the rock, one ashore. "
    "Each shift lasted six weeks, and supplies came by boat every fortnight.\n",
    "zorblat.md": "# The Zorblat river\n\nThe Zorblat river flows through the town of Quimby "
    "before reaching the sea at Vell. Its delta is home to grey herons and otters.\n\n"
    "## Floods\n\nThe great flood of 1931 drowned the lower town; the dykes were raised by "
    "two metres in 1934.\n",
    "quimby.md": "# Quimby\n\nQuimby is a market town of eight thousand people. Its harbour "
    "ships slate and wool, and its fair is held every September on the river meadow.\n",
}


def kv_prefix(session_prefix: str) -> str:
    """The Redis prefix of the pair's KV blocks."""
    return f"{session_prefix}-jobs-kv-blocks"


@dataclass
class JobsPair:
    survivor: ServerProcess
    victim: ServerProcess
    redis_url: str
    kv_prefix: str

    def wait_ready(self) -> None:
        for server in (self.victim, self.survivor):
            server.wait_ready()

    def close(self) -> None:
        """Stop both servers, then drop their KV blocks (idempotent)."""
        self.victim.stop()
        self.survivor.stop()
        drop_keys(self.redis_url, self.kv_prefix)


def _cli(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "rag_stream", *args],
        env={**os.environ, **env},
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )


def start_jobs_pair(
    start_server: Callable[..., ServerProcess],
    dirs: tuple[Path, Path, Path],
    models_dir: Path,
    redis_url: str,
    session_prefix: str,
    db: str,
) -> JobsPair:
    """``dirs``: the documents' folder and the two data directories; ``db``: a database of the
    pair's own. The servers are started, not waited for."""
    docs, victim_dir, survivor_dir = dirs
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    base = {
        "RAG_STREAM_PROFILE": "test",
        "RAG_STREAM_MODELS_DIR": str(models_dir),
        "RAG_STREAM_DATABASE_URL": db,
    }
    _cli({**base, "RAG_STREAM_DATA_DIR": str(victim_dir)}, "ingest", str(docs), "--kb", KB)
    _cli({**base, "RAG_STREAM_DATA_DIR": str(survivor_dir)}, "reindex", "--no-progress")
    blocks = kv_prefix(session_prefix)
    env = {
        "RAG_STREAM_REDIS_URL": redis_url,
        # Redis keys of their own: the session's other SmolLM2 servers (``smollm2_server``, the
        # takeover pair) share the Redis but not this database or KB, and their sweepers would
        # otherwise race these two for the killed job's stream (the one that won wrote
        # sections from its own store: section 2 differed, in CI and here)
        "RAG_STREAM_STREAMING__KEY_PREFIX": f"{session_prefix}-jobs",
        "RAG_STREAM_DATABASE_URL": db,
        # The kill test's reference job runs on the survivor first, so with the cache the
        # takeover's later sections would hit the reference's prompts: another kernel path,
        # whose float32 rounding can flip a near-tied greedy choice. Without it both runs
        # compute every prompt alike; what the test proves (the takeover continues the log
        # exactly) does not depend on it.
        # With it off, every cached token a request reports also came from Redis.
        "RAG_STREAM_ENGINE__ENABLE_PREFIX_CACHING": "false",
        "RAG_STREAM_KV__ENABLED": "true",
        "RAG_STREAM_KV__KEY_PREFIX": blocks,
    }
    victim = start_server(wait=False, data_dir=victim_dir, **env)
    survivor = start_server(wait=False, data_dir=survivor_dir, **env)
    return JobsPair(survivor, victim, redis_url, blocks)
