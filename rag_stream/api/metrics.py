"""GET /metrics (Prometheus text format)."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from rag_stream.api.browser_guard import is_loopback
from rag_stream.api.deps import BearerDep, ResourcesDep
from rag_stream.api.openapi import errors
from rag_stream.errors import NotFound
from rag_stream.kv.metrics import kv_stats

router = APIRouter(tags=["metrics"])


# (documented as text: Prometheus's exposition format; 404 when security.metrics hides it)
@router.get("/metrics", response_class=PlainTextResponse, responses=errors(404))
async def metrics(request: Request, resources: ResourcesDep, bearer: BearerDep) -> Response:
    exposure = resources.settings.security.metrics
    client = request.client.host if request.client else ""
    if exposure == "off" or (exposure == "loopback" and not is_loopback(client)):
        raise NotFound("not found")  # as if there were no such route
    if exposure == "key":
        await resources.keys.owner(bearer.credentials if bearer else None)
    m = resources.metrics
    # the KV connector runs in the engine process and keeps its counters in Redis
    if resources.kv_redis is not None:
        # if Redis fails, the scrape still answers; the KV gauges keep their last values
        with contextlib.suppress(RedisError):
            m.set_kv(await kv_stats(resources.kv_redis, resources.settings.kv.key_prefix))
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
