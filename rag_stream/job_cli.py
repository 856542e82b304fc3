"""``rag-stream job``: start a long-document job on a running server, follow it, fetch it.

Talks HTTP to the server (``--url``, env ``RAG_STREAM_URL``; ``--api-key``, env
``RAG_STREAM_API_KEY``). ``create --follow`` shows a progress bar for the whole document and one
for the section being written, and after a network error resumes following from the last event
id it saw (the job itself never depended on the connection).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from rag_stream.client import Client, Reconnect, RetryPolicy
from rag_stream.client.options import JobOptions, base_url
from rag_stream.errors import RagStreamError
from rag_stream.schemas.events import (
    Done,
    ErrorEvent,
    Event,
    Outline,
    SectionDone,
    SectionStarted,
    Token,
)
from rag_stream.schemas.jobs import JobOut

# A job runs for minutes and does not depend on the connection: keep resuming for a while
# (30 reconnections in a row without a new event, at most 2 s apart).
FOLLOW_RETRY = RetryPolicy(max_retries=30, backoff_s=0.2, factor=1.5, max_backoff_s=2.0)


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, api_key=args.api_key, retry=FOLLOW_RETRY, on_reconnect=_reconnecting)


def _reconnecting(notice: Reconnect) -> None:
    tqdm.write(
        f"connection lost ({notice.reason}); resuming after event {notice.last_event_id} "
        f"({notice.attempt}/{notice.max_retries})"
    )


def _outline(path: str) -> list[str]:
    """One heading a line; blank lines and a leading '#', '-' or '*' are ignored."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [h for line in lines if (h := line.strip().lstrip("#-* ").strip())]


class _Bars:
    """The overall bar (sections) and the current section's (tokens)."""

    def __init__(self, sections: int, section_tokens: int) -> None:
        self.section_tokens = section_tokens
        self.overall = tqdm(total=sections, unit="section", position=0, desc="document")
        self.section: tqdm[Any] | None = None

    def on(self, event: Event) -> None:
        if isinstance(event, Outline):
            self.overall.total = len(event.headings)
            self.overall.refresh()
        elif isinstance(event, SectionStarted):
            self._close_section()
            desc = f"{event.index + 1}. {event.heading}"[:40]
            self.section = tqdm(
                total=self.section_tokens, unit="tok", position=1, leave=False, desc=desc
            )
        elif isinstance(event, Token) and self.section is not None:
            self.section.update(len(event.token_ids))
        elif isinstance(event, SectionDone):
            self._close_section()
            self.overall.update(1)

    def _close_section(self) -> None:
        if self.section is not None:
            self.section.close()
            self.section = None

    def close(self) -> None:
        self._close_section()
        self.overall.close()


def follow(client: Client, job: JobOut) -> Done | ErrorEvent:
    """Follow the job's events to its end (the client resumes them with Last-Event-ID after a
    network error); its terminal event."""
    bars = _Bars(job.progress.sections_total, job.section_tokens)
    try:
        for event in client.follow_job(job.id):
            bars.on(event)
            if isinstance(event, Done | ErrorEvent):
                return event
    finally:
        bars.close()
    raise RagStreamError(f"the events of job {job.id} ended without an end")


def cmd_create(args: argparse.Namespace) -> int:
    options: JobOptions = {}
    if args.outline_file:
        options["outline"] = _outline(args.outline_file)
    if args.sections is not None:
        options["sections"] = args.sections
    if args.instructions is not None:
        options["instructions"] = args.instructions
    if args.section_tokens is not None:
        options["section_tokens"] = args.section_tokens
    if args.top_k is not None:
        options["top_k"] = args.top_k
    if args.seed is not None:
        options["seed"] = args.seed
    with _client(args) as client:
        job = client.create_job(args.kb, args.title, **options)
        print(f"job {job.id} ({job.status})", flush=True)
        if not args.follow:
            return 0
        end = follow(client, job)
    if isinstance(end, ErrorEvent):
        print(f"job failed: {end.code}: {end.message}", file=sys.stderr)
        return 1
    print(
        f"job {job.id}: {end.finish_reason}, {end.usage.completion_tokens} tokens; "
        f"`rag-stream job result {job.id}` prints it"
    )
    return 0 if end.finish_reason != "cancelled" else 1


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.get_job(args.id)
    p = job.progress
    line = f"{job.id}  {job.status}  {p.sections_done}/{p.sections_total} sections"
    line += f"  {p.tokens} tokens"
    if p.elapsed_s is not None:
        line += f"  {p.elapsed_s:.0f} s"
    if p.eta_s and job.status == "running":
        line += f"  ~{p.eta_s:.0f} s left"
    print(line)
    if job.error:
        print(f"error: {job.error.code}: {job.error.message}")
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.format == "json":
            text = client.job_result(args.id).model_dump_json(indent=2) + "\n"
        else:
            text = client.job_markdown(args.id)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.cancel_job(args.id)
    print(f"{job.id}  {job.status}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        code: int = args.job_func(args)
    except RagStreamError as exc:
        print(f"rag-stream job: {exc.status_code} {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"rag-stream job: cannot reach {base_url(args.url)}: {exc}", file=sys.stderr)
        return 1
    return code


def add_job_commands(sub: Any) -> None:
    """``rag-stream job ...`` (``sub``: the main parser's subparsers)."""
    job = sub.add_parser("job", help="long-document jobs on a running server")
    job.add_argument("--url", help="the server (default: RAG_STREAM_URL, then :8000 here)")
    job.add_argument("--api-key", help="an API key (default: RAG_STREAM_API_KEY)")
    job.set_defaults(func=run)
    job_sub = job.add_subparsers(dest="job_command", required=True)

    create = job_sub.add_parser("create", help="start a job (and --follow it)")
    create.add_argument("--kb", required=True, help="knowledge base name or id")
    create.add_argument("--title", required=True)
    create.add_argument("--outline-file", help="the section headings, one a line")
    create.add_argument("--sections", type=int, help="without an outline: how many to plan")
    create.add_argument("--instructions")
    create.add_argument("--section-tokens", type=int)
    create.add_argument("--top-k", type=int)
    create.add_argument("--seed", type=int)
    create.add_argument("--follow", action="store_true", help="progress bars until it ends")
    create.set_defaults(job_func=cmd_create)

    status = job_sub.add_parser("status", help="a job's status and progress")
    status.add_argument("id")
    status.set_defaults(job_func=cmd_status)

    result = job_sub.add_parser("result", help="a job's document (Markdown)")
    result.add_argument("id")
    result.add_argument("-o", "--output", help="write to this file instead of stdout")
    result.add_argument("--format", choices=["markdown", "json"], default="markdown")
    result.set_defaults(job_func=cmd_result)

    cancel = job_sub.add_parser("cancel", help="cancel a running job")
    cancel.add_argument("id")
    cancel.set_defaults(job_func=cmd_cancel)
