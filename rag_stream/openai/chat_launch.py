"""A chat on a model id from ``GET /v1/models``, whichever wire asked for it: the engine's model
is a ``generate`` stream of the chat, ``kb:<name>`` an ``answer`` stream on that knowledge base.
Chat completions (routes.py) and the AI SDK's UI chat (``rag_stream/ai_sdk``) both start here."""

from __future__ import annotations

from rag_stream.errors import ModelNotFound, NotFound
from rag_stream.generation.engine import Sampling
from rag_stream.kinds.answer.intent import question_from_chat
from rag_stream.kinds.answer.kind import AnswerKind
from rag_stream.kinds.generate.intent import prompt_from_chat
from rag_stream.kinds.generate.kind import GenerateKind
from rag_stream.resources import Resources
from rag_stream.schemas.chat import ChatAsk
from rag_stream.schemas.generate import Coalesce, Priority
from rag_stream.schemas.openai import KB_MODEL_PREFIX
from rag_stream.streaming.start_keys import StartKey


def kb_of(model: str, resources: Resources) -> str | None:
    """The KB a model id answers from (None: the plain engine model); 404 if unknown."""
    if model.startswith(KB_MODEL_PREFIX) and len(model) > len(KB_MODEL_PREFIX):
        return model[len(KB_MODEL_PREFIX) :]
    if model == resources.engines.get().model_name:
        return None
    raise ModelNotFound(
        f"The model {model!r} does not exist: use the engine's model or kb:<knowledge base> "
        "(GET /v1/models lists them)",
        param="model",
    )


async def launch_chat(
    resources: Resources,
    body: ChatAsk,
    model: str,
    kb: str | None,
    sampling: Sampling,
    coalesce: Coalesce,
    *,
    tenant: str,
    priority: Priority,
    wire: str,
    abandon_after_s: float | None = None,
    alias: str | None = None,
    start_key: StartKey | None = None,
) -> str:
    """Launch the chat's stream on ``model`` (``kb``: ``kb_of(model)``); its id. ``wire`` is the
    format a resume renders; ``abandon_after_s``, ``alias`` and ``start_key`` as in
    ``Streams.launch``."""
    streams, kinds = resources.streams, resources.kinds
    if kb is None:
        generated = await streams.launch(
            kinds.get(GenerateKind),
            prompt_from_chat(body, sampling, coalesce),
            tenant=tenant,
            priority=priority,
            wire=wire,
            abandon_after_s=abandon_after_s,
            alias=alias,
            start_key=start_key,
        )
        return generated.stream_id
    try:  # the KB is the only thing a question names that may not exist
        answered = await streams.launch(
            kinds.get(AnswerKind),
            question_from_chat(body, kb, sampling, coalesce),
            tenant=tenant,
            priority=priority,
            wire=wire,
            abandon_after_s=abandon_after_s,
            alias=alias,
            start_key=start_key,
        )
    except NotFound:
        raise ModelNotFound(
            f"The model {model!r} does not exist: there is no knowledge base {kb!r} "
            "(GET /v1/models lists the models)",
            param="model",
        ) from None
    return answered.stream_id
