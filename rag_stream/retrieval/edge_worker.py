"""The vector store's worker process: ``python -m rag_stream.retrieval.edge_worker PATH``.

It opens the qdrant-edge shard in PATH and runs the calls the API process sends it, one at a
time, so that Qdrant's engine, which holds the GIL for each whole call (an ``optimize()`` for
seconds), never stalls the API process's streams.

Wire: on the pipes the API process holds, length-prefixed pickles (both ends are this package;
nothing untrusted crosses them). The worker first answers ``(True, None)`` once the shard is
open, or ``(False, exception)`` (``StoreInUse`` when another process has it) and exits. Then
each request ``(method, args)`` gets ``(True, result)`` or ``(False, exception)``. End of input
closes the shard and exits; the kernel kills the worker if its parent dies (so the folder's
lock goes with the API process, as it did when the shard was in-process; see children.py).
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from pathlib import Path
from typing import IO, Any

from rag_stream.children import die_with_parent

_HEADER = struct.Struct(">Q")


def write_frame(out: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def read_frame(source: IO[bytes]) -> Any:
    """The next value, or raise EOFError when the other end has gone."""
    header = _read_exact(source, _HEADER.size)
    return pickle.loads(_read_exact(source, _HEADER.unpack(header)[0]))


def _read_exact(source: IO[bytes], size: int) -> bytes:
    parts = []
    while size:
        part = source.read(size)
        if not part:
            raise EOFError
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def main() -> None:
    die_with_parent()
    # The frames own the pipes; anything a library prints goes to stderr.
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    from rag_stream.retrieval.edge_shard import Shard

    try:
        shard = Shard(Path(sys.argv[1]))
    except Exception as exc:
        write_frame(replies, (False, _portable(exc)))
        return
    write_frame(replies, (True, None))
    try:
        while True:
            try:
                method, args = read_frame(requests)
            except EOFError:
                return
            try:
                write_frame(replies, (True, getattr(shard, method)(*args)))
            except Exception as exc:
                write_frame(replies, (False, _portable(exc)))
    finally:
        shard.close()


if __name__ == "__main__":
    main()
