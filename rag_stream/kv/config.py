"""Settings -> the vLLM ``KVTransferConfig`` that enables the Redis connector."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rag_stream.settings import Settings

CONNECTOR_NAME = "RedisKVConnector"
CONNECTOR_MODULE = "rag_stream.kv.connector"


def transfer_config_dict(
    settings: Settings,
    *,
    connector: str = CONNECTOR_NAME,
    module: str = CONNECTOR_MODULE,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The kv_transfer_config as plain data (also what ``--kv-transfer-config`` takes).

    ``connector`` and ``module`` name the class vLLM imports in its engine processes (a
    subclass of ``RedisKVConnector`` elsewhere must be importable there); ``extra`` adds
    connector settings (``max_pending_bytes``) or overrides those from ``settings``.
    """
    url = settings.resolved_kv_redis_url
    if url is None:
        raise ValueError("kv connector needs a Redis URL (kv.redis_url or redis_url)")
    return {
        "kv_connector": connector,
        "kv_connector_module_path": module,
        "kv_role": "kv_both",
        # A block evicted between match and load is recomputed instead of failing the request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "redis_url": url,
            "key_prefix": settings.kv.key_prefix,
            "ttl_s": settings.kv.ttl_s,
            "max_bytes": settings.kv.max_bytes,
            **(extra or {}),
        },
    }


def transfer_config_json(
    settings: Settings,
    *,
    connector: str = CONNECTOR_NAME,
    module: str = CONNECTOR_MODULE,
    extra: Mapping[str, Any] | None = None,
) -> str:
    return json.dumps(
        transfer_config_dict(settings, connector=connector, module=module, extra=extra)
    )


def transfer_config(
    settings: Settings,
    *,
    connector: str = CONNECTOR_NAME,
    module: str = CONNECTOR_MODULE,
    extra: Mapping[str, Any] | None = None,
) -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        **transfer_config_dict(settings, connector=connector, module=module, extra=extra)
    )
