"""``rag-stream ask``: ask a knowledge base on a running server, from the terminal.

Prints the numbered sources first, then streams the answer, then one line of figures from
``done`` (TTFT, tokens/s). A dropped connection is resumed by the client (one line on stderr
each time); Ctrl-C cancels the stream on the server and exits with 130. ``--json`` prints each
event as one JSON line instead.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

import httpx

from rag_stream.client import Client, Reconnect
from rag_stream.client.options import AnswerOptions
from rag_stream.errors import RagStreamError
from rag_stream.schemas.events import Citation, Done, ErrorEvent, Event, StreamStarted, Token

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
# Control characters other than newline and tab: model or document text must not be able to
# move the cursor or recolour the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def add_ask_command(sub: Any) -> None:
    """Register ``ask`` on the ``rag-stream`` parser's subcommands."""
    ask = sub.add_parser(
        "ask",
        help="ask a knowledge base on a running server (sources, then the streamed answer)",
        description="Ask a knowledge base on a running rag-stream server: the numbered sources "
        "first, then the answer as it streams, then TTFT and tokens/s. A dropped connection is "
        "resumed (a line on stderr says so); Ctrl-C cancels the stream on the server (exit 130).",
    )
    ask.add_argument("question")
    ask.add_argument("--kb", required=True, help="knowledge base name or id")
    ask.add_argument("--url", help="the server (default: RAG_STREAM_URL, then :8000 here)")
    ask.add_argument("--api-key", help="an API key (default: RAG_STREAM_API_KEY)")
    ask.add_argument("--conversation", metavar="ID", help="a follow-up in this conversation")
    ask.add_argument("--max-tokens", type=int, metavar="N")
    ask.add_argument("--json", action="store_true", help="one JSON event per line")
    ask.set_defaults(func=cmd_ask)


def clean(text: str) -> str:
    return _CONTROL.sub("", text)


def source_line(citation: Citation) -> str:
    where = f" › {citation.heading}" if citation.heading not in (None, citation.title) else ""
    snippet = " ".join(citation.snippet.split())
    if len(snippet) > 160:
        snippet = snippet[:159] + "…"
    return clean(f"[{citation.n}] {citation.title}{where}\n    {snippet}")


def figures_line(done: Done) -> str:
    t = done.timings
    rate = f"{1000.0 / t.tpot_ms:.1f} tokens/s" if t.tpot_ms > 0 else "- tokens/s"
    cited = ", ".join(f"[{n}]" for n in done.cited) or "none"
    return (
        f"TTFT {t.ttft_ms:.0f} ms · {rate} · {done.usage.completion_tokens} tokens "
        f"({done.usage.cached_tokens} prompt tokens cached) · {_ending(done)} · cited {cited}"
    )


def _ending(done: Done) -> str:
    return "abandoned (no reader)" if done.abandoned else done.finish_reason


class _Printer:
    """Writes events as a person reads them."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._answering = False
        self._mid_line = False  # answer text printed since the last newline
        self.conversation_id: str | None = None

    def reconnecting(self, notice: Reconnect) -> None:
        if notice.stream_id is None:
            what = f"cannot reach the server ({notice.reason}); trying again"
        else:
            what = (
                f"connection lost ({notice.reason}); reconnecting after event "
                f"{notice.last_event_id}"
            )
        start = "\n" if self._mid_line else ""
        print(
            f"{start}rag-stream ask: {what} ({notice.attempt}/{notice.max_retries})…",
            file=sys.stderr,
            flush=True,
        )

    def show(self, event: Event) -> None:
        if isinstance(event, StreamStarted):
            self.conversation_id = event.conversation_id
        elif isinstance(event, Citation):
            self._out.write(source_line(event) + "\n")
        elif isinstance(event, Token):
            if not self._answering:
                self._answering = True
                self._out.write("\n")
            text = clean(event.text)
            self._out.write(text)
            if text:
                self._mid_line = not text.endswith("\n")
        elif isinstance(event, Done):
            self._mid_line = False
            self._out.write("\n\n" + figures_line(event) + "\n")
            if self.conversation_id:
                self._out.write(
                    f"conversation {self.conversation_id} (--conversation to follow up)\n"
                )
        self._out.flush()


def cmd_ask(args: argparse.Namespace) -> int:
    options: AnswerOptions = {}
    if args.conversation:
        options["conversation_id"] = args.conversation
    if args.max_tokens is not None:
        options["max_tokens"] = args.max_tokens
    printer = _Printer(sys.stdout)
    interrupts = _Interrupts()
    with (
        Client(args.url, api_key=args.api_key, on_reconnect=printer.reconnecting) as client,
        interrupts.installed(),
    ):
        stream = client.ask(args.kb, args.question, **options)
        try:
            for event in stream:
                with interrupts.deferred():
                    if args.json:
                        print(event.model_dump_json(), flush=True)
                    else:
                        printer.show(event)
                if isinstance(event, ErrorEvent):
                    print(f"rag-stream ask: {event.code}: {event.message}", file=sys.stderr)
                    return 1
        except KeyboardInterrupt:
            stream.close()
            return _cancel(client, stream.stream_id)
        except RagStreamError as exc:
            print(f"rag-stream ask: {exc.message} ({exc.code})", file=sys.stderr)
            return 1
    return 0


class _Interrupts:
    """Ctrl-C while an event is being printed takes effect once it is printed: raised inside
    pydantic's serializer, a KeyboardInterrupt comes out as a serialization error instead."""

    def __init__(self) -> None:
        self._deferring = False
        self._pending = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._deferring:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt


def _cancel(client: Client, stream_id: str | None) -> int:
    if stream_id is None:
        print("\nrag-stream ask: interrupted before the stream started", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        outcome = client.cancel(stream_id)
    except (RagStreamError, httpx.HTTPError) as exc:
        print(f"\nrag-stream ask: interrupted; cancelling failed: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    state = "cancelled" if outcome.cancelled else outcome.message
    print(f"\nrag-stream ask: interrupted; stream {stream_id} {state}", file=sys.stderr)
    return EXIT_INTERRUPTED
