"""RedisKVConnector: a vLLM V1 KV connector that keeps full KV blocks in Redis.

vLLM creates two instances. The scheduler-side one decides: on a new request it counts how
many leading full blocks of the token ids are in Redis (``get_num_new_matched_tokens``), and
each step it lists the blocks to load (just allocated for a match) and to save (blocks that
this step fills, prompt or generated). The worker-side one moves bytes: it loads matched blocks
into the paged KV cache before the forward pass, and after it copies newly filled blocks out
and hands them to a writer thread, so decoding only pays for a memory copy.

A block that vanished between the match and the load (evicted, expired, Redis down) is
reported through ``get_block_ids_with_load_errors``; with ``kv_load_failure_policy=
"recompute"`` vLLM then recomputes from that block. Enable it with::

    KVTransferConfig(kv_connector="RedisKVConnector",
                     kv_connector_module_path="rag_stream.kv.connector",
                     kv_role="kv_both", kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"redis_url": "redis://..."})

Extra config: ``redis_url`` (required), ``key_prefix``, ``ttl_s``, ``max_bytes``,
``max_pending_bytes`` (writer queue bound; saves beyond it are dropped, never waited for).
Single worker only (tensor and pipeline parallel size 1), one full-attention KV group.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from rag_stream.kv.keys import chain_seed, extend_chain, namespace
from rag_stream.kv.store import DEFAULT_PREFIX, RedisBlockStore
from rag_stream.kv.worker import BlockMover

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class BlockTransfer:
    """Blocks of one request to move: paged-cache block ids and their chained hashes."""

    req_id: str
    block_ids: list[int]
    hashes: list[bytes]


@dataclass
class RedisKVMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


@dataclass
class _Tracked:
    request: Request
    hashes: list[bytes] = field(default_factory=list)
    # Blocks [0, saved) are in Redis already or are not ours to save.
    saved: int = 0


@dataclass
class _Match:
    start: int  # first block after the local prefix-cache hit
    found: int  # leading blocks found in Redis from there
    queried: int


def layout_of(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> dict[str, object]:
    """Everything that decides the bytes of a block; hashed into the key namespace."""
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = str(vllm_config.model_config.model)
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size * parallel.pipeline_parallel_size != 1:
        raise ValueError("RedisKVConnector supports one worker (tensor/pipeline parallel 1)")
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1 or type(groups[0].kv_cache_spec) is not FullAttentionSpec:
        raise ValueError("RedisKVConnector needs exactly one full-attention KV cache group")
    spec = groups[0].kv_cache_spec
    return {
        # The same local model under a relative or an absolute path is the same model.
        "model": os.path.realpath(model) if os.path.isdir(model) else model,
        "revision": vllm_config.model_config.revision,
        "dtype": str(vllm_config.model_config.dtype),
        "kv_dtype": str(spec.dtype),
        "cache_dtype": vllm_config.cache_config.cache_dtype,
        "block_size": spec.block_size,
        "layers": list(groups[0].layer_names),
        "kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "head_size_v": spec.head_size_v,
        "platform": current_platform.device_type,
        # The paged layout can change between vLLM releases.
        "vllm": vllm.__version__,
    }


class RedisKVConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config)
        url = extra.get("redis_url")
        if not url:
            raise ValueError("RedisKVConnector needs kv_connector_extra_config.redis_url")
        self._layout = layout_of(vllm_config, kv_cache_config)
        self._namespace = namespace(self._layout)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._store = RedisBlockStore(
            url,
            prefix=str(extra.get("key_prefix", DEFAULT_PREFIX)),
            namespace=self._namespace,
            ttl_s=int(extra.get("ttl_s", 3600)),
            max_bytes=int(extra.get("max_bytes", 2 << 30)),
        )
        self._load_enabled = bool(self._kv_transfer_config.is_kv_consumer)
        self._save_enabled = bool(self._kv_transfer_config.is_kv_producer)
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            log.warning(
                "RedisKVConnector: kv_load_failure_policy is %r; a block evicted between "
                'match and load then fails the request. Set "recompute".',
                self._kv_transfer_config.kv_load_failure_policy,
            )
        # scheduler side
        self._tracked: dict[str, _Tracked] = {}
        self._matches: dict[str, _Match] = {}
        self._loads: dict[str, BlockTransfer] = {}
        # worker side
        self._mover: BlockMover | None = None
        if role == KVConnectorRole.WORKER:
            self._mover = BlockMover(
                self._store,
                layer_names=list(kv_cache_config.kv_cache_groups[0].layer_names),
                num_blocks=kv_cache_config.num_blocks,
                block_size=self._block_size,
                max_pending_bytes=int(extra.get("max_pending_bytes", 512 << 20)),
            )
        log.info(
            "RedisKVConnector (%s): namespace %s, prefix %s, role %s",
            role.name,
            self._namespace,
            self._store.prefix,
            self._kv_transfer_config.kv_role,
        )

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is only a future cache miss

    # ---- worker side -------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._mover is not None
        self._mover.register(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, RedisKVMetadata) and self._mover is not None
        for load in meta.loads:
            self._mover.load(load.block_ids, load.hashes)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv has loaded every layer before the forward pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # whole blocks are copied out once per step, in wait_for_save

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, RedisKVMetadata) and self._mover is not None
        for save in meta.saves:
            self._mover.save(save.block_ids, save.hashes)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._mover.take_load_errors() if self._mover is not None else set()

    def shutdown(self) -> None:
        if self._mover is not None:
            self._mover.close()
        self._store.close()

    # ---- scheduler side ----------------------------------------------------------------

    def _track(self, request: Request) -> _Tracked:
        tracked = self._tracked.get(request.request_id)
        if tracked is None:
            tracked = self._tracked[request.request_id] = _Tracked(request)
        return tracked

    def _chain(self, tracked: _Tracked, n_blocks: int) -> list[bytes]:
        if len(tracked.hashes) < n_blocks:
            request = tracked.request
            lora = request.lora_request.lora_name if request.lora_request else ""
            seed = chain_seed(self._namespace, f"{request.cache_salt or ''}|{lora}")
            tokens = list(request.all_token_ids[: n_blocks * self._block_size])
            extend_chain(tracked.hashes, tokens, self._block_size, seed, n_blocks)
        return tracked.hashes

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if not self._load_enabled:
            return 0, False
        # The last token is always computed: its logits give the next token.
        n_full = (request.num_tokens - 1) // self._block_size
        start = num_computed_tokens // self._block_size
        if n_full <= start:
            self._matches[request.request_id] = _Match(start, 0, 0)
            return 0, False
        hashes = self._chain(self._track(request), n_full)
        found = self._store.count_leading(hashes[start:n_full])
        self._matches[request.request_id] = _Match(start, found, n_full - start)
        return found * self._block_size, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        tracked = self._track(request)
        match = self._matches.pop(request.request_id, None)
        if match is None:
            return
        n_load = num_external_tokens // self._block_size
        tracked.saved = max(tracked.saved, match.start + n_load)
        if match.queried:
            self._store.add_stats({"lookup_blocks": match.queried, "hit_blocks": n_load})
        if n_load == 0:
            return
        block_ids = blocks.get_block_ids()[0][match.start : match.start + n_load]
        hashes = tracked.hashes[match.start : match.start + n_load]
        self._plan_load(BlockTransfer(request.request_id, block_ids, hashes))

    def _plan_load(self, load: BlockTransfer) -> None:
        """Queue matched blocks for the workers to load before the request's next step."""
        self._loads[load.req_id] = load

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = RedisKVMetadata(loads=list(self._loads.values()))
        self._loads.clear()
        if not self._save_enabled:
            return meta
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            self._plan_save(meta, new.req_id, new.num_computed_tokens + scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            self._plan_save(meta, req_id, computed + scheduled[req_id])
        return meta

    def _plan_save(self, meta: RedisKVMetadata, req_id: str, end: int) -> None:
        """Save the blocks this step completes (their token ids must all be known)."""
        tracked = self._tracked.get(req_id)
        if tracked is None or self._kv_cache_manager is None:
            return
        full = min(end, tracked.request.num_tokens) // self._block_size
        if full <= tracked.saved:
            return
        hashes = self._chain(tracked, full)
        block_ids: Sequence[int] = self._kv_cache_manager.get_block_ids(req_id)[0]
        meta.saves.append(
            BlockTransfer(
                req_id, list(block_ids[tracked.saved : full]), hashes[tracked.saved : full]
            )
        )
        tracked.saved = full

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        self._matches.pop(request.request_id, None)
        return False, None
