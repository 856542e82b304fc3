"""What a stream needs to (re)run its token phase in any process, stored in Redis."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rag_stream.generation.engine import Sampling


@dataclass
class Plan:
    kind: str  # which finalizer ends the stream: "generate" | "answer"
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    context: dict[str, Any] = field(default_factory=dict)

    def sampling(self, already_generated: int = 0) -> Sampling:
        return Sampling(
            max_tokens=self.max_tokens - already_generated,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)
