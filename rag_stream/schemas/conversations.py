"""GET /v1/conversations: the caller's conversations, newest first, a page at a time."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

# a title is the first question, cut to this many characters (the whole is in the conversation)
TITLE_CHARS = 200


class ConversationSummary(BaseModel):
    id: str
    kb_id: str | None
    kb: str | None = Field(description="the knowledge base's name; null once it is deleted")
    title: str = Field(description=f"the first question, at most {TITLE_CHARS} characters")
    created_at: datetime
    updated_at: datetime = Field(description="when its last answer was saved")
    turns: int = Field(description="questions asked (each with its answer)")


class ConversationList(BaseModel):
    data: list[ConversationSummary]
    limit: int
    next_before: str | None = Field(
        description="pass as `before` for the next (older) page; null on the last page"
    )
