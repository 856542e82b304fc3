"""Test doubles for the streaming layer: a byte-level tokenizer and a minimal stream kind.

The tokenizer makes every UTF-8 byte one token, so a Chinese character always spans several
tokens: the hardest case for incremental detokenization, with no model files needed.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from rag_stream.generation.engine import Engine, EngineStep, Sampling
from rag_stream.generation.stub import StubEngine
from rag_stream.kinds.plan import TokenPlan
from rag_stream.kinds.tokens import TokenOutput, token_phase
from rag_stream.schemas.events import Done, ErrorEvent, Event, FinishReason
from rag_stream.schemas.generate import Coalesce
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.admission import Admission, Priority
from rag_stream.streaming.context import StreamContext
from rag_stream.streaming.event_log import EventLog, StreamMeta
from rag_stream.streaming.kinds import plan_error
from rag_stream.streaming.service import Streams


class ByteTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    @functools.cached_property
    def backend_tokenizer(self) -> Tokenizer:
        """The same tokenizer as a ``tokenizers`` one (what fast tokenizers expose): a
        byte-level BPE without merges, token id = byte value."""
        alphabet = _byte_alphabet()
        vocab = {alphabet[b]: b for b in range(256)}
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        return backend


def _byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte: printable Latin-1 bytes stand for
    themselves, the others take the code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spare = (256 + n for n in range(256))
    return {b: chr(b) if b in printable else chr(next(spare)) for b in range(256)}


def stub_engine(**kwargs: Any) -> StubEngine:
    return StubEngine(ByteTokenizer(), **kwargs)


class RecordingStubEngine(StubEngine):
    """The stub engine, writing each request's sampling to a JSON-lines file as it comes (the
    stub server's ``STUB_REQUEST_LOG``): what a test in another process can see of what
    reached the engine."""

    def __init__(self, log_path: str, **kwargs: Any) -> None:
        super().__init__(ByteTokenizer(), **kwargs)
        self._log_path = log_path

    def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        line = {
            "request_id": request_id,
            "priority": sampling.priority,
            "max_tokens": sampling.max_tokens,
            "affinity": sampling.affinity,
        }
        with open(self._log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")
        return super().generate(request_id, prompt, sampling)


@dataclass
class EngineRequest:
    """One request a ``LedgerStubEngine`` was sent, and how far it went."""

    request_id: str
    tokens: int = 0  # generated so far
    # its last step's finish reason ("cancelled": aborted), "left" when its reader stopped
    # reading first, None while it runs
    ended: str | None = None


class LedgerStubEngine(StubEngine):
    """The stub engine keeping every request it was sent in memory (``requests``, by id, in
    the order sent): what an in-process test checks of an abort, such as which requests a
    cancelled stream made and whether they ended early."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(ByteTokenizer(), **kwargs)
        self.requests: dict[str, EngineRequest] = {}

    async def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        request = self.requests[request_id] = EngineRequest(request_id)
        try:
            async for step in super().generate(request_id, prompt, sampling):
                request.tokens += len(step.token_ids)
                request.ended = step.finish_reason
                yield step
        finally:
            if request.ended is None:
                request.ended = "left"

    def of_stream(self, stream_id: str) -> list[EngineRequest]:
        """The requests of a stream's runs (their ids begin with the stream's id)."""
        return [r for r in self.requests.values() if r.request_id.startswith(f"{stream_id}:")]


@dataclass
class ToyRun:
    kind: ToyKind
    plan: TokenPlan
    out: TokenOutput = field(default_factory=TokenOutput)
    first: bool = True
    model: str = "stub"
    conversation_id: str | None = None
    accepted_at: float = field(default_factory=time.monotonic)
    priority: Priority = "interactive"
    initial_plan: TokenPlan | None = None

    async def run(self, ctx: StreamContext) -> FinishReason:
        if self.first:
            await ctx.save_plan(self.plan)
        return await token_phase(ctx, self.kind.engine, self.plan, self.out)

    async def log_lost(self, error: ErrorEvent) -> None:
        self.kind.lost.append(error.code)

    async def finish(self, ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
        self.out.run.finish_reason = reason
        self.kind.finished.append(self.out.text)
        self.kind.finished_for.append(ctx.tenant)
        return Done(id=event_id, finish_reason=reason, usage=self.out.run.usage())


@dataclass(frozen=True)
class ToyIntent:
    prompt_ids: list[int]
    max_tokens: int
    coalesce: Coalesce | None = None


class ToyKind:
    """Generation straight from prompt ids, finishing without a database."""

    name = "toy"

    def __init__(self, engine: Engine, detached: bool = False) -> None:
        self.engine = engine
        self.detached = detached
        self.finished: list[str] = []  # the text each finished run reported
        self.finished_for: list[str] = []  # and whose stream it was (ctx.tenant)
        self.lost: list[str] = []  # the error codes of runs that ended by log_lost

    async def accept(self, intent: ToyIntent, tenant: str) -> ToyRun:
        plan = TokenPlan(
            prompt_ids=intent.prompt_ids,
            max_tokens=intent.max_tokens,
            coalesce=intent.coalesce or Coalesce(),
        )
        return ToyRun(self, plan)

    async def started(self, stream_id: str, producer: ToyRun) -> None:
        return None

    async def not_started(self, producer: ToyRun, error: Exception) -> None:
        return None

    async def can_continue(self, meta: StreamMeta) -> bool:
        return meta.model == self.engine.model_name

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> ToyRun:
        try:
            plan = TokenPlan.model_validate_json(plan_json)
        except ValidationError as exc:
            raise plan_error(self.name, exc) from None
        return ToyRun(self, plan, TokenOutput.from_log(logged), first=False)


def toy_streams(
    log: EventLog, engine: Engine, detached: bool = False, **cfg: Any
) -> tuple[Streams, ToyKind]:
    kind = ToyKind(engine, detached)
    admission = Admission(max_active=1000, max_queued=1000, retry_after_s=1)
    return Streams(log, StreamingSettings(**cfg), [kind], admission), kind


async def start_toy(
    streams: Streams,
    kind: ToyKind,
    prompt_ids: list[int],
    max_tokens: int,
    coalesce: Coalesce | None = None,
    *,
    tenant: str = LOCAL_TENANT,
    abandon_after_s: float | None = None,
) -> str:
    """A toy stream started through the front door, as a route starts one; its id."""
    intent = ToyIntent(prompt_ids, max_tokens, coalesce)
    launched = await streams.launch(
        kind, intent, tenant=tenant, priority="interactive", abandon_after_s=abandon_after_s
    )
    return launched.stream_id
