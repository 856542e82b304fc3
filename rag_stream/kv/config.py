"""Settings -> the vLLM ``KVTransferConfig`` that enables the Redis connector."""

from __future__ import annotations

import json
from typing import Any

from rag_stream.settings import Settings

CONNECTOR_NAME = "RedisKVConnector"
CONNECTOR_MODULE = "rag_stream.kv.connector"


def transfer_config_dict(settings: Settings, **extra: Any) -> dict[str, Any]:
    """The kv_transfer_config as plain data (also what ``--kv-transfer-config`` takes)."""
    url = settings.resolved_kv_redis_url
    if url is None:
        raise ValueError("kv connector needs a Redis URL (kv.redis_url or redis_url)")
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        # A block evicted between match and load is recomputed instead of failing the request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "redis_url": url,
            "key_prefix": settings.kv.key_prefix,
            "ttl_s": settings.kv.ttl_s,
            "max_bytes": settings.kv.max_bytes,
            **extra,
        },
    }


def transfer_config_json(settings: Settings, **extra: Any) -> str:
    return json.dumps(transfer_config_dict(settings, **extra))


def transfer_config(settings: Settings, **extra: Any) -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(**transfer_config_dict(settings, **extra))
