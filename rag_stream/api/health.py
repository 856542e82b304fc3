"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rag_stream.api.deps import ResourcesDep
from rag_stream.store.db import ping as db_ping

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(resources: ResourcesDep) -> JSONResponse:
    checks: dict[str, str] = {"engine": resources.engines.state}
    try:
        await resources.redis.client.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"failed: {exc}"
    try:
        await db_ping(resources.db_engine)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"failed: {exc}"
    try:
        await resources.vectors.ping()
        checks["vector_store"] = "ok"
    except Exception as exc:
        checks["vector_store"] = f"failed: {exc}"
    failing = [name for name, state in checks.items() if state not in ("ok", "ready")]
    body: dict[str, object] = {
        "status": "ready" if not failing else "unavailable",
        "checks": checks,
    }
    if failing:
        body["failing"] = failing
    return JSONResponse(body, status_code=503 if failing else 200)
