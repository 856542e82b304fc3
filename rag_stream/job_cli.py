"""``rag-stream job``: start a long-document job on a running server, follow it, fetch it.

Talks HTTP to the server (``--url``, env ``RAG_STREAM_URL``; ``--api-key``, env
``RAG_STREAM_API_KEY``). ``create --follow`` shows a progress bar for the whole document and one
for the section being written, and after a network error resumes following from the last event
id it saw (the job itself never depended on the connection).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse
from tqdm import tqdm

DEFAULT_URL = "http://127.0.0.1:8000"
RETRIES = 30  # reconnections in a row without a new event, before giving up


class JobCliError(Exception):
    pass


def _client(args: argparse.Namespace, timeout: float | None = 60) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=timeout)


def _check(r: httpx.Response) -> httpx.Response:
    if r.is_success:
        return r
    try:
        err = r.json()["error"]
        raise JobCliError(f"{r.status_code} {err['code']}: {err['message']}")
    except (ValueError, KeyError, TypeError):
        raise JobCliError(f"{r.status_code}: {r.text[:300]}") from None


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

    def on(self, event: str, data: dict[str, Any]) -> None:
        if event == "outline":
            self.overall.total = len(data["headings"])
            self.overall.refresh()
        elif event == "section":
            self._close_section()
            desc = f"{data['index'] + 1}. {data['heading']}"[:40]
            self.section = tqdm(
                total=self.section_tokens, unit="tok", position=1, leave=False, desc=desc
            )
        elif event == "token" and self.section is not None:
            self.section.update(len(data["token_ids"]))
        elif event == "section_done":
            self._close_section()
            self.overall.update(1)

    def _close_section(self) -> None:
        if self.section is not None:
            self.section.close()
            self.section = None

    def close(self) -> None:
        self._close_section()
        self.overall.close()


def follow(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """Follow the job's events to its end (reconnecting with Last-Event-ID); its terminal
    event's data."""
    last: int | None = None
    failures = 0
    bars = _Bars(job["progress"]["sections_total"], job["section_tokens"])
    try:
        while True:
            headers = {} if last is None else {"Last-Event-ID": str(last)}
            try:
                with (
                    _client(args, timeout=None) as client,
                    connect_sse(
                        client, "GET", f"/v1/jobs/{job['id']}/events", headers=headers
                    ) as source,
                ):
                    _check(source.response)
                    for sse in source.iter_sse():
                        if not sse.data:
                            continue  # a keep-alive
                        data = json.loads(sse.data)
                        if sse.id:
                            last, failures = int(sse.id), 0
                        bars.on(sse.event, data)
                        if sse.event in ("done", "error"):
                            return {"event": sse.event, **data}
            except httpx.HTTPError as exc:
                failures += 1
                if failures > RETRIES:
                    raise JobCliError(f"lost the server: {exc}") from exc
                tqdm.write(f"connection lost ({exc}); resuming after event {last}")
                time.sleep(min(2.0, 0.2 * failures))
    finally:
        bars.close()


def cmd_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kb": args.kb, "title": args.title}
    if args.outline_file:
        body["outline"] = _outline(args.outline_file)
    if args.sections is not None:
        body["sections"] = args.sections
    for name in ("instructions", "section_tokens", "top_k", "seed"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    with _client(args) as client:
        job = _check(client.post("/v1/jobs", json=body)).json()
    print(f"job {job['id']} ({job['status']})")
    if not args.follow:
        return 0
    end = follow(args, job)
    if end["event"] == "error":
        print(f"job failed: {end['code']}: {end['message']}", file=sys.stderr)
        return 1
    print(
        f"job {job['id']}: {end['finish_reason']}, {end['usage']['completion_tokens']} tokens; "
        f"`rag-stream job result {job['id']}` prints it"
    )
    return 0 if end["finish_reason"] != "cancelled" else 1


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _check(client.get(f"/v1/jobs/{args.id}")).json()
    p = job["progress"]
    line = f"{job['id']}  {job['status']}  {p['sections_done']}/{p['sections_total']} sections"
    line += f"  {p['tokens']} tokens"
    if p["elapsed_s"] is not None:
        line += f"  {p['elapsed_s']:.0f} s"
    if p["eta_s"] and job["status"] == "running":
        line += f"  ~{p['eta_s']:.0f} s left"
    print(line)
    if job["error"]:
        print(f"error: {job['error']['code']}: {job['error']['message']}")
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    with _client(args) as client:
        r = _check(client.get(f"/v1/jobs/{args.id}/result", params={"format": args.format}))
    if args.output:
        Path(args.output).write_text(r.text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(r.text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _check(client.post(f"/v1/jobs/{args.id}/cancel")).json()
    print(f"{job['id']}  {job['status']}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        code: int = args.job_func(args)
    except JobCliError as exc:
        print(f"rag-stream job: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"rag-stream job: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    return code


def add_job_commands(sub: Any) -> None:
    """``rag-stream job ...`` (``sub``: the main parser's subparsers)."""
    job = sub.add_parser("job", help="long-document jobs on a running server")
    job.add_argument("--url", default=os.environ.get("RAG_STREAM_URL", DEFAULT_URL))
    job.add_argument("--api-key", default=os.environ.get("RAG_STREAM_API_KEY"))
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
