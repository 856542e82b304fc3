"""Incremental, UTF-8-safe detokenization.

Byte-level tokenizers split multi-byte characters across tokens; decoding a lone token then yields
U+FFFD. We decode a short window of recent ids and hold tokens back until their text is complete,
so every delta is whole characters. Seeding with earlier ids (crash takeover) continues exactly
where the previous process stopped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from rag_stream.generation.engine import Tokenizer

REPLACEMENT = "\ufffd"
# A UTF-8 character has at most 4 bytes, so a genuinely incomplete one never spans more tokens.
MAX_HELD_TOKENS = 4


@dataclass(frozen=True)
class TextDelta:
    index: int  # position of the first token id in the generated sequence
    token_ids: list[int]
    text: str


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, generated: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(generated)
        # Text is final up to read_offset; prefix_offset starts the decoding window.
        self._read = len(self._ids)
        self._prefix = max(0, self._read - 6)

    def _window_text(self, end: int) -> str:
        return self._tok.decode(self._ids[self._prefix : end], skip_special_tokens=True)

    def push(self, token_ids: Sequence[int]) -> TextDelta | None:
        """Add ids; return the newly complete text with the ids it came from, if any."""
        self._ids.extend(token_ids)
        return self._flush(force=False)

    def finish(self) -> TextDelta | None:
        """Emit whatever is held, even if incomplete (the stream is ending)."""
        return self._flush(force=True)

    def _flush(self, *, force: bool) -> TextDelta | None:
        if self._read >= len(self._ids):
            return None
        before = self._window_text(self._read)
        after = self._window_text(len(self._ids))
        held = len(self._ids) - self._read
        if after.endswith(REPLACEMENT) and not force and held < MAX_HELD_TOKENS:
            return None
        # Only incomplete characters at the end of `before` can change; keep the shared prefix.
        text = after[len(os.path.commonprefix([before, after])) :]  # noqa: RUF071
        delta = TextDelta(self._read, self._ids[self._read :], text)
        self._prefix = self._read
        self._read = len(self._ids)
        return delta
