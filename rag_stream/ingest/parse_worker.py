"""The worker process of ``sandbox``: ``python -m rag_stream.ingest.parse_worker``.

It imports the parsers once, writes ``READY``, then answers jobs until its stdin ends (the API
process closed it), or the kernel kills it with the API process (``rag_stream/children.py``).
Per job the parent sends a 4-byte big-endian length, a ``Job`` as JSON and ``Job.size`` bytes of
upload; the worker answers with an 8-byte length and a ``Reply`` as JSON. Replies go to a private
copy of stdout and fd 1 is pointed at stderr, so a library that prints cannot corrupt one.

Each parse runs under an address-space limit (``Job.memory_mb``: a MemoryError becomes a reply,
not a swapping machine) and a CPU-time limit a little over the parent's clock, which stops the
worker even if the parent is gone and no longer able to kill it. This module imports only what a
worker needs: it starts once per worker, and again after every failed parse.
"""

from __future__ import annotations

import importlib
import logging
import os
import resource
import signal
import sys
from typing import IO, Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from rag_stream.children import die_with_parent
from rag_stream.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from rag_stream.ingest.parsing import ParsedText, describe, parse

logger = logging.getLogger(__name__)

READY = b"ready\n"
_CPU_GRACE_S = 5  # the worker's own limit is a backstop behind the parent's clock
_PRELOAD = ("pypdf", "bs4", "markdown_it")  # parsing.py imports them when first needed


class Job(BaseModel):
    media_type: str
    size: int
    max_text_chars: int
    memory_mb: int
    timeout_s: float


class Parsed(BaseModel):
    kind: Literal["parsed"] = "parsed"
    parsed: ParsedText


class Failure(BaseModel):
    kind: Literal["failure"] = "failure"
    code: str  # of an exception in rag_stream.errors
    message: str


Reply = Annotated[Parsed | Failure, Field(discriminator="kind")]
REPLY: TypeAdapter[Parsed | Failure] = TypeAdapter(Reply)


def handle(job: Job, data: bytes) -> Parsed | Failure:
    """One parse under the job's memory and CPU limits; every failure is a reply."""
    what = describe(job.media_type)
    saved = {kind: resource.getrlimit(kind) for kind in (resource.RLIMIT_AS, resource.RLIMIT_CPU)}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_limit = int(usage.ru_utime + usage.ru_stime + job.timeout_s) + _CPU_GRACE_S
    _lower_limit(resource.RLIMIT_AS, job.memory_mb * 1024 * 1024)
    _lower_limit(resource.RLIMIT_CPU, cpu_limit)
    try:
        return Parsed(parsed=parse(data, job.media_type, job.max_text_chars))
    except (InvalidRequest, PayloadTooLarge, UnsupportedMediaType) as exc:
        return Failure(code=exc.code, message=exc.message)
    except MemoryError:
        message = f"{what} needs more than {job.memory_mb} MB of memory to parse"
    except RecursionError:
        message = f"{what} is nested too deeply to parse"
    except Exception:
        # Whatever else a parser raises names its internals, not the file's problem: the
        # traceback goes to the log, the client gets a sentence.
        logger.warning("parsing %s failed", job.media_type, exc_info=True)
        message = f"{what} could not be parsed"
    finally:
        for kind, limits in saved.items():
            resource.setrlimit(kind, limits)
    return Failure(code=InvalidRequest.code, message=message)


def _lower_limit(kind: int, value: int) -> None:
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    if soft == resource.RLIM_INFINITY or value < soft:
        resource.setrlimit(kind, (value, hard))


def reply_limit(job: Job) -> int:
    """The most a reply may hold: the text JSON-escaped, and blocks of a few characters each."""
    return 32 * job.max_text_chars + (1 << 20)


def encode(job: Job, reply: Parsed | Failure) -> bytes:
    body = reply.model_dump_json().encode()
    if len(body) > reply_limit(job):
        # Text within the limit can still be cut into so many blocks, each naming its section,
        # that the reply would be gigabytes: the parent would refuse to read it.
        message = f"{describe(job.media_type)} has too many paragraphs and headings to index"
        body = Failure(code=PayloadTooLarge.code, message=message).model_dump_json().encode()
    return body


def read_exact(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"expected {size} bytes, got {len(data)}")
    return data


def serve(requests: IO[bytes], out: IO[bytes]) -> None:
    """Answer jobs until ``requests`` ends."""
    out.write(READY)
    out.flush()
    while len(head := requests.read(4)) == 4:
        job = Job.model_validate_json(read_exact(requests, int.from_bytes(head, "big")))
        body = encode(job, handle(job, read_exact(requests, job.size)))
        out.write(len(body).to_bytes(8, "big") + body)
        out.flush()


def main() -> None:
    die_with_parent()  # a parse of a hostile file must not outlive a killed API process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the parent's to handle
    # The CPU limit ends a worker with SIGXCPU, which dumps core by default: not in the cwd.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    for name in _PRELOAD:
        importlib.import_module(name)
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
