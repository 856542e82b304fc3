"""Sampling parameters a request may ask for, bounded by the limits and the context window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rag_stream.errors import InvalidRequest, PayloadTooLarge
from rag_stream.generation.engine import Engine, Sampling
from rag_stream.settings import LimitsSettings


def sampling_for(
    limits: LimitsSettings,
    max_tokens: int | None,
    temperature: float,
    top_p: float,
    seed: int | None,
) -> Sampling:
    wanted = limits.default_max_tokens if max_tokens is None else max_tokens
    if not 1 <= wanted <= limits.max_tokens:
        raise InvalidRequest(
            f"max_tokens must be between 1 and {limits.max_tokens}, got {wanted}",
            param="max_tokens",
        )
    return Sampling(max_tokens=wanted, temperature=temperature, top_p=top_p, seed=seed)


def fit_to_window(engine: Engine, prompt_ids: Sequence[int], sampling: Sampling) -> Sampling:
    """Refuse prompts that fill the window; shorten max_tokens to what still fits."""
    room = engine.max_model_len - len(prompt_ids)
    if room < 1:
        raise PayloadTooLarge(
            f"prompt is {len(prompt_ids)} tokens; the model's context window is "
            f"{engine.max_model_len} tokens"
        )
    if sampling.max_tokens <= room:
        return sampling
    return replace(sampling, max_tokens=room)
