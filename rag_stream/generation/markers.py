"""Citation markers: ``[n]`` in generated text names source ``n``. One definition for every
kind and every wire (answers, job sections, the chat-completions annotations)."""

from __future__ import annotations

import re
from collections.abc import Container, Iterator

# Up to four digits: a job numbers its sources across the whole document.
MARKER = re.compile(r"\[(\d{1,4})\]")


def markers(text: str) -> Iterator[re.Match[str]]:
    """Each ``[n]`` in ``text``, in order (``int(match.group(1))`` is its number)."""
    return MARKER.finditer(text)


def cited_markers(text: str, known: Container[int]) -> list[int]:
    """The numbers ``text`` cites that name a known source, each once, ascending."""
    return sorted({n for n in (int(m.group(1)) for m in markers(text)) if n in known})
