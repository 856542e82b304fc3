"""Liveness and readiness."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rag_stream.api.deps import ResourcesDep
from rag_stream.store.db import ping as db_ping

logger = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


def _readiness(status: str) -> dict[str, object]:
    """The body of /readyz (its own shape, not the error body), for the OpenAPI document."""
    return {
        "type": "object",
        "required": ["status", "checks"],
        "properties": {
            "status": {"const": status},
            "checks": {"type": "object", "additionalProperties": {"type": "string"}},
            "failing": {"type": "array", "items": {"type": "string"}},
        },
    }


_READYZ_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"content": {"application/json": {"schema": _readiness("ready")}}},
    503: {
        "description": "a dependency is down, or the engine is still starting",
        "content": {"application/json": {"schema": _readiness("unavailable")}},
    },
}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses=_READYZ_RESPONSES)
async def readyz(resources: ResourcesDep) -> JSONResponse:
    checks: dict[str, str] = {"engine": resources.engines.state}
    probes: dict[str, Callable[[], Awaitable[object]]] = {
        "redis": resources.redis.client.ping,
        "database": lambda: db_ping(resources.db_engine),
        "vector_store": resources.vectors.ping,
    }
    for name, probe in probes.items():
        try:
            await probe()
            checks[name] = "ok"
        except Exception as exc:  # the reason goes to the log: it may name hosts or paths
            logger.warning("readyz: %s failed: %s", name, exc)
            checks[name] = "failed: unreachable or not responding"
    failing = [name for name, state in checks.items() if state not in ("ok", "ready")]
    body: dict[str, object] = {
        "status": "ready" if not failing else "unavailable",
        "checks": checks,
    }
    if failing:
        body["failing"] = failing
    return JSONResponse(body, status_code=503 if failing else 200)
