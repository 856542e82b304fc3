"""The Engine interface over vLLM OpenAI servers (``engine_urls``): engine replicas that run
elsewhere, e.g. on GPU boxes.

Prompts go as token ids to ``/v1/completions`` with ``return_token_ids``, so the servers stream
the very ids the in-process engine would, and the text still comes from our detokenizer. The
final usage chunk carries ``cached_tokens`` when the servers run with
``--enable-prompt-tokens-details``. Cancelling closes the request's connection, which vLLM
treats as an abort. The tokenizer and chat template are the model's own files (the same the
servers load), and each server's ``/v1/models`` must list the served model with the same
context length.

Routing is ``replicas.Router``: a request's affinity key (its conversation, else the first KV
block of its prompt) picks a replica by consistent hashing. If a replica fails mid-request (the
connection breaks, or the stream ends without a finish), the request continues on another
replica from the prompt plus the ids already produced, for what remains of ``max_tokens``: the
same continuation as a takeover, so greedy decoding gives the same text.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import anyio
import httpx
from httpx_sse import aconnect_sse

from rag_stream.errors import ConfigError, EngineUnavailable
from rag_stream.generation.detokenize import backend_of
from rag_stream.generation.engine import EngineStep, Sampling, Tokenizer
from rag_stream.generation.replicas import Health, Replica, Router
from rag_stream.schemas.events import FinishReason
from rag_stream.settings import Settings

log = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}
_BLOCK_SIZE = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.M)


class _ReplicaFailed(Exception):
    pass


class RemoteEngine:
    """Build it with ``await RemoteEngine.start(settings)``."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        model_name: str,
        max_model_len: int,
        cache_block_size: int,
        router: Router,
        client: httpx.AsyncClient,
        send_priority: bool,
    ) -> None:
        self.tokenizer = tokenizer
        backend_of(tokenizer)  # streaming decodes with it: refuse a slow tokenizer at start
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_token_ids = frozenset([eos] if isinstance(eos, int) else [])
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.cache_block_size = cache_block_size
        self.router = router
        self._client = client
        self._send_priority = send_priority
        self._health: Health | None = None
        self._open: dict[str, httpx.Response] = {}
        self._aborted: set[str] = set()

    @classmethod
    async def start(cls, settings: Settings) -> RemoteEngine:
        urls = [u.rstrip("/").removesuffix("/v1") for u in settings.engine_urls]
        client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None))
        try:
            name = settings.resolved_served_model_name
            # A replica down at start (restarting, its box rebooting) is routed around, as one
            # that goes down later is: it joins once it answers and serves the same model with
            # the same shape (``_rejoin``). Only with none answering is there nothing to serve.
            answers = await asyncio.gather(
                *(_served(client, url, name) for url in urls), return_exceptions=True
            )
            for answer in answers:
                if isinstance(answer, BaseException) and not isinstance(answer, EngineUnavailable):
                    raise answer
            served = [a for a in answers if not isinstance(a, BaseException)]
            if not served:
                raise next(a for a in answers if isinstance(a, BaseException))
            if len(set(served)) > 1:
                raise ConfigError(
                    f"the engine servers differ in (context length, KV block size): {served}"
                )
            length, block_size = served[0]
            tokenizer = await _load_tokenizer(settings.resolved_model)
            replicas = [Replica(u) for u in urls]
            for replica, answer in zip(replicas, answers, strict=True):
                if isinstance(answer, BaseException):
                    log.warning("engine replica %s is down at start: %s", replica.url, answer)
                    replica.healthy = replica.checked = False
            router = Router(
                replicas,
                settings.engine.replica_max_waiting,
                round_robin=settings.engine.replica_routing == "round_robin",
            )
            engine = cls(
                tokenizer,
                name,
                length,
                block_size,
                router,
                client,
                settings.engine.scheduling_policy == "priority",
            )
        except BaseException:
            await client.aclose()
            raise
        engine._health = Health(
            router, client, settings.engine.replica_health_s, rejoin=engine._rejoin
        )
        await engine._health.check_all()
        engine._health.start()
        log.info("engine: %d of %d vLLM server(s) serve %s", len(served), len(urls), name)
        return engine

    async def _rejoin(self, replica: Replica) -> bool:
        """Whether a replica first seen healthy after the start serves what the others do."""
        try:
            shape = await _served(self._client, replica.url, self.model_name)
        except (EngineUnavailable, ConfigError) as exc:
            log.warning("engine replica %s cannot join: %s", replica.url, exc)
            return False
        if shape != (self.max_model_len, self.cache_block_size):
            log.error(
                "engine replica %s serves %s with (context length, KV block size) %s, the others "
                "%s: it is left out",
                replica.url,
                self.model_name,
                shape,
                (self.max_model_len, self.cache_block_size),
            )
            return False
        return True

    def reachable(self) -> bool:
        return any(r.healthy for r in self.router.replicas)

    async def wait_dead(self) -> None:
        await asyncio.get_running_loop().create_future()  # replicas come back: never dead

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        apply = getattr(self.tokenizer, "apply_chat_template")  # noqa: B009
        return cast(str, apply(list(messages), tokenize=False, add_generation_prompt=True))

    def affinity(self, ids: Sequence[int], sampling: Sampling) -> str:
        if sampling.affinity:
            return sampling.affinity
        head = ids[: self.cache_block_size]  # the first KV block, or the whole short prompt
        return hashlib.blake2b(repr(list(head)).encode(), digest_size=8).hexdigest()

    async def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        ids = (
            self.tokenizer.encode(prompt, add_special_tokens=False)
            if isinstance(prompt, str)
            else list(prompt)
        )
        key = self.affinity(ids, sampling)
        try:
            async for step in self._failing_over(request_id, ids, key, sampling):
                yield step
            if request_id in self._aborted:
                yield EngineStep([], len(ids), 0, "cancelled")
        finally:
            # also when the caller stops reading first (a stop string found, a cancel): the
            # request's id would otherwise stay in the set for the life of the process
            self._aborted.discard(request_id)

    async def _failing_over(
        self, request_id: str, ids: list[int], key: str, sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        produced: list[int] = []
        tried: list[Replica] = []
        while request_id not in self._aborted:
            replica = self.router.pick(key, exclude=tried)
            if replica is None:
                raise EngineUnavailable("no engine replica is reachable")
            tried.append(replica)
            remaining = sampling.max_tokens - len(produced)
            try:
                async for step in self._request(
                    replica, request_id, ids + produced, remaining, sampling
                ):
                    produced.extend(step.token_ids)
                    yield EngineStep(
                        step.token_ids, len(ids), step.cached_tokens, step.finish_reason
                    )
                    if step.finish_reason is not None:
                        return
            except _ReplicaFailed as exc:
                if request_id in self._aborted:
                    return
                replica.healthy = False  # until its next health check says otherwise
                log.warning("engine replica %s failed on %s: %s", replica.url, request_id, exc)
            if len(produced) >= sampling.max_tokens:
                yield EngineStep([], len(ids), 0, "length")
                return

    async def _request(
        self,
        replica: Replica,
        request_id: str,
        ids: list[int],
        max_tokens: int,
        sampling: Sampling,
    ) -> AsyncIterator[EngineStep]:
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "ignore_eos": sampling.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "request_id": request_id,
        }
        if self._send_priority:
            body["priority"] = sampling.priority
        finish: FinishReason | None = None
        try:
            async with aconnect_sse(
                self._client, "POST", f"{replica.url}/v1/completions", json=body
            ) as source:
                response = source.response
                if response.status_code >= 500:
                    raise _ReplicaFailed(f"HTTP {response.status_code}")
                if response.status_code != 200:
                    await response.aread()
                    raise RuntimeError(f"engine replica refused the request: {response.text}")
                self._open[request_id] = response
                async for sse in source.aiter_sse():
                    if sse.data == "[DONE]":
                        break
                    chunk = json.loads(sse.data)
                    for choice in chunk.get("choices") or []:
                        reason = choice.get("finish_reason")
                        if reason is not None:
                            finish = _FINISH.get(reason, "stop")
                        token_ids = list(choice.get("token_ids") or [])
                        if token_ids:
                            yield EngineStep(token_ids, len(ids), 0)
                    usage = chunk.get("usage")
                    if usage and finish is not None:
                        details = usage.get("prompt_tokens_details") or {}
                        cached = int(details.get("cached_tokens") or 0)
                        yield EngineStep([], len(ids), cached, finish)
                        return
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _ReplicaFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._open.pop(request_id, None)
        if finish is None:
            raise _ReplicaFailed("the stream ended without a finish")
        yield EngineStep([], len(ids), 0, finish)  # a server that sent no usage chunk

    async def abort(self, request_id: str) -> None:
        response = self._open.pop(request_id, None)
        if response is not None:
            self._aborted.add(request_id)
            await response.aclose()  # vLLM aborts a request whose client went away

    async def close(self) -> None:
        if self._health is not None:
            await self._health.stop()
        await self._client.aclose()


async def _served(client: httpx.AsyncClient, url: str, name: str) -> tuple[int, int]:
    """The context length ``url`` serves ``name`` with (its ``/v1/models``), and its KV block
    size (``vllm:cache_config_info`` in its ``/metrics``)."""
    try:
        response = await client.get(f"{url}/v1/models")
        response.raise_for_status()
        models = response.json().get("data") or []
        metrics = await client.get(f"{url}/metrics")
        metrics.raise_for_status()
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineUnavailable(f"engine server {url} did not answer: {exc}") from exc
    found = _BLOCK_SIZE.search(metrics.text)
    if found is None:
        raise ConfigError(f"engine server {url} reports no KV block size in /metrics")
    for model in models:
        if model.get("id") == name:
            return int(model.get("max_model_len") or 0), int(found.group(1))
    listed = ", ".join(str(m.get("id")) for m in models)
    raise ConfigError(f"engine server {url} serves {listed or 'nothing'}, not {name}")


async def _load_tokenizer(model: str) -> Tokenizer:
    """The model's own tokenizer and chat template. The embedder loads at the same time, and
    transformers' lazy module can fail an import of a name another thread is importing
    ("cannot import name 'AutoTokenizer'", seen at start): a second try finds it loaded."""
    for attempt in range(3):
        try:
            from transformers import AutoTokenizer

            break
        except ImportError:
            if attempt == 2:
                raise
            await asyncio.sleep(1.0)
    return cast(Tokenizer, await anyio.to_thread.run_sync(AutoTokenizer.from_pretrained, model))
