"""Stop sequences: the answer ends before the first of them, which is never shown.

Text that could be the start of a stop sequence is held back until the next tokens show it is
not (OpenAI's and vLLM's behaviour), so no client ever sees part of one. Deltas are held whole:
their token ids cannot be split, and each ``token`` event keeps the ids its text came from.
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_stream.generation.detokenize import TextDelta


def first_stop(text: str, stops: Sequence[str]) -> int:
    """Where the first stop sequence in ``text`` starts, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=-1)


class StopStrings:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held: list[TextDelta] = []
        self.hit = False  # a stop sequence was generated: the answer is over

    def __bool__(self) -> bool:
        """Whether there is any stop sequence to look for."""
        return bool(self._stops)

    def push(self, delta: TextDelta) -> TextDelta | None:
        """The text that can be shown now (cut before a stop sequence), if any."""
        if not self._stops:
            return delta
        self._held.append(delta)
        text = "".join(d.text for d in self._held)
        cut = first_stop(text, self._stops)
        if cut >= 0:
            self.hit = True
            return self._release(text[:cut])
        if self._may_start_stop(text):
            return None
        return self._release(text)

    def finish(self) -> TextDelta | None:
        """Generation ended without a stop sequence: show what was held."""
        if not self._held:
            return None
        return self._release("".join(d.text for d in self._held))

    def _may_start_stop(self, text: str) -> bool:
        return any(text.endswith(s[:k]) for s in self._stops for k in range(1, len(s)))

    def _release(self, text: str) -> TextDelta:
        held, self._held = self._held, []
        return TextDelta(held[0].index, [t for d in held for t in d.token_ids], text)
