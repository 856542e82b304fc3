"""Write the sync client (sync_client.py, sync_stream.py) from the async one.

    .venv/bin/python scripts/gen_sync_client.py            # rewrite rag_stream/client/sync_*.py
    .venv/bin/python scripts/gen_sync_client.py --check    # exit 1 if they are stale
    .venv/bin/python scripts/gen_sync_client.py --out DIR  # write them into DIR instead

The async modules are the ones written by hand. unasync (python-trio's token rewriter) drops
``async`` and ``await`` and renames the names below, then ruff sorts the imports and formats
the result as `make check` wants it. What differs by more than a name (sleeping, reading a
file) is written twice in rag_stream/client/flavours.py. tests/unit/test_client_generated.py
fails when the committed files are not what this script writes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "rag_stream" / "client"
SOURCES = {"async_client.py": "sync_client.py", "async_stream.py": "sync_stream.py"}

# On top of unasync's own (AsyncGenerator, __aenter__, __anext__, ...).
RENAMES = {
    "AsyncClient": "Client",  # httpx's and ours
    "AsyncBaseTransport": "BaseTransport",
    "AsyncEventStream": "EventStream",
    "async_stream": "sync_stream",
    "aclose": "close",
    "aread": "read",
    "aconnect_sse": "connect_sse",
    "aiter_sse": "iter_sse",
    # an async generator left early is closed by the event loop some time later, hence
    # aclosing; a sync one is closed as soon as it is dropped
    "aclosing": "nullcontext",
    "asleep": "sleep",
    "aread_bytes": "read_bytes",
}


def _header(source: str) -> str:
    return (
        f"# Generated from {source} by scripts/gen_sync_client.py: do not edit. Change\n"
        f"# {source} and run `.venv/bin/python scripts/gen_sync_client.py`.\n"
    )


def _ruff(args: list[str], text: str, target: Path) -> str:
    """``text`` through ruff as if it were the file ``target`` (so the project's settings
    apply)."""
    command = [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(target), "-"]
    done = subprocess.run(
        command, input=text, capture_output=True, text=True, cwd=ROOT, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {args[0]} failed on the generated {target.name}:\n{done.stderr}")
    return done.stdout


def generated() -> dict[str, str]:
    """The text of each sync module, by file name."""
    texts: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        rules = [unasync.Rule(a, s, additional_replacements=RENAMES) for a, s in SOURCES.items()]
        copies = []
        for source in SOURCES:
            copy = Path(tmp) / source
            copy.write_text((CLIENT / source).read_text())
            copies.append(str(copy))
        unasync.unasync_files(copies, rules)
        for source, name in SOURCES.items():
            target = CLIENT / name
            text = _header(source) + (Path(tmp) / name).read_text()
            text = _ruff(["check", "--fix", "--quiet"], text, target)
            texts[name] = _ruff(["format", "--quiet"], text, target)
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    parser.add_argument("--out", type=Path, default=CLIENT, help="where to write them")
    args = parser.parse_args()
    texts = generated()
    if args.check:
        stale = [n for n, text in texts.items() if (CLIENT / n).read_text() != text]
        for name in stale:
            print(f"rag_stream/client/{name} is stale: run scripts/gen_sync_client.py")
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (args.out / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
