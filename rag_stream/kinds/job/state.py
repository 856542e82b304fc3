"""A job's progress as its events tell it: the outline, each section's citations, token ids and
text, and which sections are done.

The first run keeps it up to date as it emits; a continuation after a takeover rebuilds it from
the events already in the log, so both go on from the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_stream.generation.markers import cited_markers
from rag_stream.schemas.events import (
    Citation,
    CitationBody,
    Event,
    JobStarted,
    Outline,
    SectionDone,
    SectionStarted,
    Token,
)


@dataclass
class SectionState:
    index: int
    heading: str
    citations: list[CitationBody] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # generated token ids, as logged
    pieces: list[str] = field(default_factory=list)
    done: SectionDone | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def cited(self) -> list[int]:
        """The [n] markers of the text that name one of this section's sources."""
        mine = {c.n for c in self.citations}
        return cited_markers(self.text, mine)


@dataclass
class JobState:
    started: JobStarted | None = None
    outline: Outline | None = None
    sections: dict[int, SectionState] = field(default_factory=dict)

    @classmethod
    def from_log(cls, events: Sequence[Event]) -> JobState:
        state = cls()
        for event in events:
            state.add(event)
        return state

    def add(self, event: Event) -> None:
        if isinstance(event, JobStarted):
            self.started = event
        elif isinstance(event, Outline):
            self.outline = event
        elif isinstance(event, SectionStarted):
            self.sections[event.index] = SectionState(event.index, event.heading)
        elif isinstance(event, Citation):
            current = self.current
            if current is not None:
                current.citations.append(CitationBody.model_validate(event, from_attributes=True))
        elif isinstance(event, Token) and event.section is not None:
            section = self.sections[event.section]
            section.ids.extend(event.token_ids)
            section.pieces.append(event.text)
        elif isinstance(event, SectionDone):
            self.sections[event.index].done = event

    @property
    def current(self) -> SectionState | None:
        """The latest section started, if it is not done."""
        if not self.sections:
            return None
        last = self.sections[max(self.sections)]
        return None if last.done is not None else last

    @property
    def finished(self) -> list[SectionState]:
        return [s for _, s in sorted(self.sections.items()) if s.done is not None]

    def known_sources(self) -> dict[str, int]:
        """chunk id -> its [n], for every source an earlier section cited."""
        return {c.chunk_id: c.n for s in self.sections.values() for c in s.citations}

    def tail_ids(self, index: int, tokens: int) -> list[int]:
        """The last ``tokens`` token ids of section ``index - 1`` (none for the first)."""
        previous = self.sections.get(index - 1)
        if previous is None or tokens <= 0:
            return []
        return previous.ids[-tokens:]
