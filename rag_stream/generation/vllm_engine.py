"""The in-process vLLM engine (AsyncLLM, V1) behind the Engine interface.

vLLM is imported lazily: it is heavy, and the test doubles and CLI commands that do not generate
must not pay for it. The engine core runs in a spawned process, so whatever starts this engine
needs an ``if __name__ == "__main__":`` guard. The core is started, and stopped, on a thread of
the engine's own that lives until the engine is closed, and it dies with that thread, so with
this process however it ends (``rag_stream/children.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any, cast

from rag_stream.children import Starter, environment, spawned_children_die
from rag_stream.errors import EngineDied, EngineUnavailable
from rag_stream.generation.detokenize import backend_of
from rag_stream.generation.engine import (
    EngineStep,
    Sampling,
    StepHandler,
    Tokenizer,
    pull_steps,
)
from rag_stream.schemas.events import FinishReason
from rag_stream.settings import Settings

log = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}


class VLLMEngine:
    """Owns one AsyncLLM. Build it with ``await VLLMEngine.start(settings)``."""

    def __init__(self, llm: Any, starter: Starter, model_name: str, max_model_len: int) -> None:
        self._llm = llm
        self._starter = starter  # the engine core's parent thread
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.tokenizer = cast(Tokenizer, llm.get_tokenizer())
        backend_of(self.tokenizer)  # streaming decodes with it: refuse a slow tokenizer at start
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.stop_token_ids = frozenset([eos] if isinstance(eos, int) else [])
        self.cache_block_size = int(llm.vllm_config.cache_config.block_size or 16)
        # Under "fcfs" vLLM takes requests in arrival order; a priority is then meaningless, and
        # older vLLM versions refuse one, so none is sent.
        self._priorities = llm.vllm_config.scheduler_config.policy == "priority"
        self._pushes = _collectors_take_put()
        if not self._pushes:
            log.warning(
                "engine: this vLLM does not hand outputs to a request's collector through its "
                "put(); each token is pulled by its producer's task (more CPU a token)"
            )

    @classmethod
    async def start(cls, settings: Settings, **engine_overrides: Any) -> VLLMEngine:
        model = settings.resolved_model
        log.info(
            "engine: starting vLLM with %s (%s); this takes 20-60 s on CPU", model, settings.dtype
        )
        started = time.monotonic()

        def build() -> Any:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

            cfg = settings.engine
            executor: dict[str, Any] = {}
            child_env: dict[str, str] = {}
            if current_platform.is_cpu() and cfg.cpu_executor == "uni":
                # vLLM switches a CPU "uni" executor back to "mp" unless V1 multiprocessing is
                # off; that variable only picks the executor here (AsyncLLM always runs its
                # engine core in a process of its own). The core is spawned with this process's
                # environment, so it starts with cpu_threads threads (vLLM sets its OpenMP
                # variables around its worker processes the same way).
                executor["distributed_executor_backend"] = "uni"
                child_env = {
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                    "OMP_NUM_THREADS": str(cfg.cpu_threads),
                }
            args = AsyncEngineArgs(
                model=model,
                dtype=settings.dtype,
                max_model_len=cfg.max_model_len,
                enable_prefix_caching=cfg.enable_prefix_caching,
                enforce_eager=cfg.enforce_eager,
                max_num_seqs=cfg.max_num_seqs,
                scheduling_policy=cfg.scheduling_policy,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                kv_cache_memory_bytes=int(cfg.kv_cache_gb * (1 << 30)),
                # On the CPU backend this reserves a share of node memory; the KV size above
                # is what we actually want, so keep the reservation check permissive.
                gpu_memory_utilization=0.3,
                seed=0,
                speculative_config=cfg.speculative_config(),
                **executor,
                **engine_overrides,
            )
            with environment(child_env), spawned_children_die():
                return AsyncLLM.from_engine_args(args)

        starter = Starter("engine-core-parent")
        building = starter.submit(build)
        try:
            llm = await asyncio.wrap_future(building)
        except asyncio.CancelledError:
            # The start goes on in its thread (it cannot be interrupted): stop what it makes.
            starter.submit(lambda: _shut_down(building))
            starter.close()
            raise
        except Exception as exc:
            starter.close()
            raise EngineUnavailable(f"vLLM failed to start with model {model}: {exc}") from exc
        try:
            engine = cls(
                llm,
                starter,
                model_name=settings.resolved_served_model_name,
                max_model_len=settings.engine.max_model_len,
            )
        except TypeError as exc:
            await asyncio.wrap_future(starter.submit(llm.shutdown))
            starter.close()
            raise EngineUnavailable(f"model {model} cannot be served: {exc}") from exc
        log.info("engine: ready in %.1f s", time.monotonic() - started)
        return engine

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        apply = getattr(self.tokenizer, "apply_chat_template")  # noqa: B009
        return cast(str, apply(list(messages), tokenize=False, add_generation_prompt=True))

    def _request(self, prompt: str | Sequence[int], sampling: Sampling) -> tuple[list[int], Any]:
        """The prompt's ids and vLLM's sampling parameters for one request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        ids = (
            self.tokenizer.encode(prompt, add_special_tokens=False)
            if isinstance(prompt, str)
            else list(prompt)
        )
        params = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            ignore_eos=sampling.ignore_eos,
            detokenize=False,  # text comes from our UTF-8-safe detokenizer
            output_kind=RequestOutputKind.DELTA,
        )
        return ids, params

    def _priority(self, sampling: Sampling) -> int:
        return sampling.priority if self._priorities else 0

    async def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        ids, params = self._request(prompt, sampling)
        try:
            stream = self._llm.generate(
                {"prompt_token_ids": ids},
                params,
                request_id=request_id,
                priority=self._priority(sampling),
            )
            async for out in stream:
                yield _step(out, len(ids))
        except Exception as exc:
            if (died := _died(exc)) is not None:
                raise died from exc
            raise

    async def push_steps(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling, on_step: StepHandler
    ) -> None:
        """``PushesSteps``: ``on_step`` runs inside vLLM's output handler.

        vLLM hands each request's outputs to a collector of its own (``put``), which wakes the
        task waiting in ``AsyncLLM.generate``. Here the request's collector is given a ``put``
        of ours instead, so that one engine step reaches every request's handler in the output
        handler's own turn: the token phase then costs no task wake a step (the readers' wake
        is the one left, as in vLLM's own server)."""
        if not self._pushes:
            await pull_steps(self, request_id, prompt, sampling, on_step)
            return
        ids, params = self._request(prompt, sampling)
        n_prompt = len(ids)
        ended: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def put(out: Any) -> None:  # never raises: it runs in vLLM's output handler
            if ended.done():
                return  # (the abort's last output, after on_step said no more)
            if isinstance(out, BaseException):
                ended.set_exception(out)
                return
            try:
                step = _step(out, n_prompt)
                more = on_step(step)
            except BaseException as exc:
                ended.set_exception(exc)
                return
            if step.finish_reason is not None or not more:
                ended.set_result(step.finish_reason is None)  # True: abort it

        try:
            queue = await self._llm.add_request(
                request_id,
                {"prompt_token_ids": ids},
                params,
                priority=self._priority(sampling),
            )
        except Exception as exc:
            if (died := _died(exc)) is not None:
                raise died from exc
            raise
        try:
            early = queue.output  # put before the request was ours (add_request's await)
            queue.output = None
            queue.put = put
            if early is not None:
                put(early)
            if await ended:
                await self._llm.abort(request_id)
        except BaseException as exc:
            with contextlib.suppress(Exception):  # (a dead engine: nothing left to abort)
                await self._llm.abort(queue.request_id, internal=True)
            if (died := _died(exc)) is not None:
                raise died from exc
            raise
        finally:
            queue.close()

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def reachable(self) -> bool:
        return not self._llm.errored  # the engine core died (it does not come back)

    async def wait_dead(self) -> None:
        # vLLM offers no event for it (its output handler starts with the first request)
        while not self._llm.errored:  # noqa: ASYNC110
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        # AsyncLLM.shutdown cancels its output handler only after stopping the engine core; a
        # handler that sees the core go first logs EngineDeadError as an ERROR. Stop it first.
        handler = getattr(self._llm, "output_handler", None)
        if handler is not None and not handler.done():
            handler.cancel()
            await asyncio.wait({handler})
        try:
            await asyncio.wrap_future(self._starter.submit(self._llm.shutdown))
        finally:
            self._starter.close()


def _step(out: Any, n_prompt: int) -> EngineStep:
    """One of vLLM's (delta) request outputs as an engine step."""
    completion = out.outputs[0]
    reason = completion.finish_reason if out.finished else None
    return EngineStep(
        token_ids=list(completion.token_ids),
        prompt_tokens=n_prompt,
        cached_tokens=out.num_cached_tokens or 0,
        finish_reason=_FINISH.get(reason, "stop") if reason else None,
    )


def _collectors_take_put() -> bool:
    """Whether the installed vLLM hands each request's outputs to its collector by calling the
    collector's ``put``, and keeps one not yet taken in its ``output``: what ``push_steps``
    replaces and reads. Checked in vLLM's own source, so that a release that works otherwise
    makes the engine pull its steps rather than wait for a call that never comes."""
    import inspect

    from vllm.v1.engine import output_processor

    collector = getattr(output_processor, "RequestOutputCollector", None)
    processor = getattr(output_processor, "OutputProcessor", None)
    if collector is None or processor is None or not callable(getattr(collector, "put", None)):
        return False
    try:
        calls_put = ".queue.put(" in inspect.getsource(processor)
        keeps_output = "self.output" in inspect.getsource(collector)
    except (OSError, TypeError):  # (no source installed)
        return False
    return calls_put and keeps_output


def _died(exc: BaseException) -> EngineDied | None:
    """vLLM's error as ours when it says its engine core is gone."""
    if type(exc).__name__ == "EngineDeadError":
        return EngineDied(f"engine died: {exc}")
    return None


def _shut_down(building: Future[Any]) -> None:
    """Shut down the engine a start that was given up on made, if it made one."""
    if not building.cancelled() and building.exception() is None:
        building.result().shutdown()
