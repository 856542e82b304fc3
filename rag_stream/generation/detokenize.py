"""Incremental, UTF-8-safe detokenization.

Byte-level tokenizers split multi-byte characters across tokens; decoding a lone token then yields
U+FFFD. ``tokenizers``' ``DecodeStream`` (Rust, about 2 µs a token) decodes incrementally and
holds tokens back until their text is complete, so every delta is whole characters. Seeding it
with earlier ids (crash takeover) continues exactly where the previous process stopped.

The tokenizer must be a fast (``tokenizers``-backed) one: ``backend_tokenizer`` is what
``DecodeStream`` steps with.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers.decoders import DecodeStream

from rag_stream.generation.engine import Tokenizer

# Ids before the held ones that give them context when a stream ends mid-character.
_CONTEXT_IDS = 6


@dataclass(slots=True)  # (not frozen: one a token, and a frozen init costs four times as much)
class TextDelta:
    index: int  # position of the first token id in the generated sequence
    token_ids: list[int]
    text: str


def backend_of(tokenizer: Tokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` behind a fast tokenizer (what DecodeStream needs)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} is not a fast (tokenizers-backed) tokenizer")
    return backend


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, generated: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._backend = backend_of(tokenizer)
        self._stream = DecodeStream(ids=list(generated), skip_special_tokens=True)
        self._next = len(generated)  # position of the next id pushed
        self._held: list[int] = []  # ids whose text is not complete yet
        self._context: deque[int] = deque(generated[-_CONTEXT_IDS:], maxlen=_CONTEXT_IDS)

    def push(self, token_id: int) -> TextDelta | None:
        """Add an id; return the newly complete text with the ids it came from, if any."""
        self._held.append(token_id)
        text = self._stream.step(self._backend, token_id)
        return None if text is None else self._release(text)

    def finish(self) -> TextDelta | None:
        """Emit whatever is held, even if incomplete (the stream is ending)."""
        if not self._held:
            return None
        context = self._decode(list(self._context))
        whole = self._decode([*self._context, *self._held])
        return self._release(whole[len(context) :] if whole.startswith(context) else whole)

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def _release(self, text: str) -> TextDelta:
        delta = TextDelta(self._next, self._held, text)
        self._next += len(self._held)
        self._context.extend(self._held)
        self._held = []
        return delta
