"""A request's priority class, and the number the engine orders waiting requests by.

A client asks for ``interactive`` (the default) or ``batch``. A long prompt runs as ``batch``
whatever it asked: its prefill holds the engine for a long step, so it waits behind interactive
requests, both in this process's admission queue and in the engine's (vLLM's ``priority``
scheduling policy; lower is served first).
"""

from __future__ import annotations

from typing import Literal

from rag_stream.settings import LimitsSettings

PriorityClass = Literal["interactive", "batch"]
ENGINE_PRIORITY: dict[PriorityClass, int] = {"interactive": 0, "batch": 1}


def priority_class(
    requested: PriorityClass, prompt_tokens: int, tenant: str, limits: LimitsSettings
) -> PriorityClass:
    """``batch`` if asked, or if the prompt is long and the tenant may not keep it interactive."""
    if requested == "batch":
        return "batch"
    if (
        prompt_tokens >= limits.long_prompt_tokens
        and tenant not in limits.long_prompt_interactive_tenants
    ):
        return "batch"
    return "interactive"
