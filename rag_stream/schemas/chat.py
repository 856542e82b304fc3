"""What a chat request is, whichever wire it came in on (OpenAI's chat completions, the AI
SDK's UI messages): turns with a role and text, and the answer options they share. The kinds
translate any such request into their intent the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rag_stream.schemas.generate import Priority
from rag_stream.schemas.kbs import SearchMode


class ChatTurn(Protocol):
    @property
    def role(self) -> str: ...  # system, developer, user or assistant

    @property
    def text(self) -> str: ...


class ChatAsk(Protocol):
    @property
    def messages(self) -> Sequence[ChatTurn]: ...  # the last is the user's

    @property
    def top_k(self) -> int | None: ...

    @property
    def mmr(self) -> bool: ...

    @property
    def mode(self) -> SearchMode: ...

    @property
    def priority(self) -> Priority: ...

    @property
    def stops(self) -> list[str]: ...
