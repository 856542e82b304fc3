"""A job's outline when the request gives none: the model writes N headings, one a line.

The reply is parsed strictly: numbering, bullets and Markdown marks are stripped, and it must
then hold exactly N non-empty headings (an introduction line ending with ":" is allowed before
them). Otherwise one retry with a stricter prompt and another seed, then the job fails with
``outline_failed``: a half-parsed outline never becomes a document.

A stream stopped while the outline is planned (a cancel, say) is not a failed outline: the
request in flight is aborted, no further attempt starts, and ``Stopped`` ends the job as any
stop does (``cancelled``), however little of a reply the aborted request left.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial

from rag_stream.errors import RagStreamError
from rag_stream.generation.engine import Engine, Sampling
from rag_stream.schemas.jobs import JobSpec
from rag_stream.streaming.context import StreamContext

_MARKS = re.compile(
    r"^(?:#{1,6}\s*|[-*•+]\s+|\(?\d{1,2}[.):]\s*|[IVX]{1,5}\.\s+"
    r"|(?:section|chapter|part)\s+\d{1,2}\s*[:.\-–—]\s*)+",
    re.IGNORECASE,
)


class OutlineFailed(RagStreamError):
    code = "outline_failed"


def parse_outline(text: str, n: int, max_chars: int) -> list[str] | None:
    """Exactly ``n`` headings from the model's reply, or None."""
    headings = []
    for line in text.splitlines():
        heading = _MARKS.sub("", line.strip()).strip().strip("*_`\"'").strip()
        if heading:
            headings.append(heading)
    if len(headings) == n + 1 and headings[0].endswith(":"):
        headings = headings[1:]  # "Here is the outline:"
    if len(headings) != n or any(len(h) > max_chars or h.endswith(":") for h in headings):
        return None
    return headings


def _messages(spec: JobSpec, strict: bool) -> list[dict[str, str]]:
    ask = (
        f"Write the outline of a document titled {spec.title!r}: exactly {spec.sections} "
        "section headings, one per line."
    )
    if spec.instructions:
        ask += f"\nThe document's instructions: {spec.instructions}"
    if strict:
        ask += (
            f"\nReply with {spec.sections} lines and nothing else: no introduction, no "
            "numbering, no blank lines, no sub-points."
        )
    return [
        {"role": "system", "content": "You plan documents. You reply with headings only."},
        {"role": "user", "content": ask},
    ]


async def plan_outline(
    ctx: StreamContext,
    engine: Engine,
    spec: JobSpec,
    max_tokens: int,
    max_heading_chars: int,
    priority: int,
    affinity: str | None = None,
) -> list[str]:
    """Ask the model for ``spec.sections`` headings (twice at most); raise ``Stopped`` as soon
    as the stream must stop."""
    replies: list[str] = []
    for attempt, strict in enumerate((False, True)):
        request_id = f"{ctx.run_id}:outline{attempt}"
        # No await between the check and the request's abort being registered: a stop comes
        # either before this attempt (it never starts) or while it runs (it is aborted).
        ctx.check()
        ctx.on_stop(partial(engine.abort, request_id))
        prompt = engine.chat_prompt(_messages(spec, strict))
        seed = None if spec.seed is None else spec.seed + attempt
        sampling = Sampling(
            max_tokens=max_tokens,
            temperature=spec.temperature,
            seed=seed,
            priority=priority,
            affinity=affinity,
        )
        ids: list[int] = []
        async for step in engine.generate(request_id, prompt, sampling):
            ids.extend(t for t in step.token_ids if t not in engine.stop_token_ids)
        ctx.check()  # an aborted request ends early: what it wrote is no outline to judge
        reply = engine.tokenizer.decode(ids, skip_special_tokens=True)
        headings = parse_outline(reply, spec.sections, max_heading_chars)
        if headings is not None:
            return headings
        replies.append(reply)
    raise OutlineFailed(_failure(spec.sections, replies))


def _failure(n: int, replies: Sequence[str]) -> str:
    shown = " / ".join(repr(r.strip()[:120]) for r in replies)
    return (
        f"the model did not write an outline of exactly {n} headings (replies: {shown}); "
        "send the outline yourself"
    )
