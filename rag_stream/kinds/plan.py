"""TokenPlan: what any process needs to (re)run a stream's token phase, saved in Redis.

Each kind extends it with what its finisher needs; it is stored as JSON in the stream's meta and
validated when read back, so a plan written by an incompatible version fails with a clear error.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict

from rag_stream.generation.engine import Sampling
from rag_stream.schemas.generate import Coalesce


class TokenPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    queue_ms: float = 0.0  # measured by the first run; a takeover reports the same
    coalesce: Coalesce = Coalesce()  # a takeover keeps the stream's tokens per event
    stop: list[str] = []  # stop sequences: the answer ends before the first one
    ignore_eos: bool = False
    priority: int = 0  # the engine's order for waiting requests: a takeover keeps its class
    affinity: str | None = None  # the engine replica it goes to (remote engines): Sampling

    def sampling(self, already_generated: int = 0) -> Sampling:
        return Sampling(
            max_tokens=self.max_tokens - already_generated,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            priority=self.priority,
            affinity=self.affinity,
        )

    @classmethod
    def of(cls, prompt_ids: list[int], sampling: Sampling, **extra: object) -> Self:
        return cls.model_validate(
            {
                "prompt_ids": prompt_ids,
                "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "seed": sampling.seed,
                "ignore_eos": sampling.ignore_eos,
                "priority": sampling.priority,
                "affinity": sampling.affinity,
                **extra,
            }
        )
