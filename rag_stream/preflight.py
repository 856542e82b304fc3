"""Checks run by ``rag-stream serve`` before anything starts, each failing with one line that
names the setting to fix."""

from __future__ import annotations

import os
from pathlib import Path

from rag_stream.errors import ConfigError
from rag_stream.retrieval.collections import LEGACY_COLLECTION
from rag_stream.retrieval.stores import REINDEX_HINT, old_store
from rag_stream.settings import ENV_PREFIX, Settings, without_password
from rag_stream.store.db import upgrade


def _looks_like_path(value: str) -> bool:
    return os.path.isabs(value) or value.startswith((".", "~"))


def check_model_paths(settings: Settings) -> None:
    for env, value in (
        ("MODEL", settings.resolved_model),
        ("EMBEDDER", settings.resolved_embedder),
    ):
        if _looks_like_path(value) and not Path(value).expanduser().exists():
            hint = "" if getattr(settings, env.lower()) else " (run `make install` to prepare it)"
            raise ConfigError(f"{ENV_PREFIX}{env}: model path {value} does not exist{hint}")


def check_redis(settings: Settings) -> None:
    if not settings.redis_url:
        return
    import redis

    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except Exception as exc:
        url = settings.redis_url
        raise ConfigError(
            f"{ENV_PREFIX}REDIS_URL: cannot reach {without_password(url, url)}: "
            f"{without_password(str(exc), url)}"
        ) from None
    finally:
        client.close()


def check_qdrant(settings: Settings) -> None:
    if not settings.qdrant_url:
        return
    import httpx

    base = settings.qdrant_url.rstrip("/")
    try:
        httpx.get(base + "/collections", timeout=3).raise_for_status()
        legacy = httpx.get(f"{base}/collections/{LEGACY_COLLECTION}/exists", timeout=3)
        legacy.raise_for_status()
    except Exception as exc:
        url = settings.qdrant_url
        raise ConfigError(
            f"{ENV_PREFIX}QDRANT_URL: cannot reach {without_password(url, url)}: "
            f"{without_password(str(exc), url)}"
        ) from None
    if legacy.json().get("result", {}).get("exists"):
        raise ConfigError(
            f"{ENV_PREFIX}QDRANT_URL: the server holds the collection {LEGACY_COLLECTION!r}, "
            f"made before hybrid search: {REINDEX_HINT}"
        )


def check_vector_store(settings: Settings) -> None:
    """An embedded store made before hybrid search is not opened (its searches would miss
    BM25 and it would shadow the new one): one line saying how to move it."""
    message = old_store(settings)
    if message:
        raise ConfigError(message)


def migrate(settings: Settings) -> None:
    try:
        upgrade(settings.resolved_database_url)
    except Exception as exc:
        said = without_password(str(exc), settings.database_url).strip()
        first = said.splitlines()[0] if said else type(exc).__name__
        raise ConfigError(f"{ENV_PREFIX}DATABASE_URL: migration failed: {first}") from None


def preflight(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    check_model_paths(settings)
    check_redis(settings)
    check_qdrant(settings)
    check_vector_store(settings)
    migrate(settings)
