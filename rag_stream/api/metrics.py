"""GET /metrics (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.asyncio import Redis
from redis.exceptions import RedisError

from rag_stream.api.deps import ResourcesDep
from rag_stream.kv.metrics import kv_stats
from rag_stream.metrics import Metrics

router = APIRouter(tags=["metrics"])


@router.get("/metrics")
async def metrics(request: Request, resources: ResourcesDep) -> Response:
    m: Metrics = request.app.state.metrics
    kv = resources.settings.kv
    if kv.enabled:  # the connector runs in the engine process and keeps its counters in Redis
        own = kv.redis_url is None or kv.redis_url == resources.settings.redis_url
        client = resources.redis.client if own else Redis.from_url(str(kv.redis_url))
        try:
            m.set_kv(await kv_stats(client, kv.key_prefix))
        except RedisError:
            pass  # the scrape still answers; the KV gauges keep their last values
        finally:
            if not own:
                await client.aclose()
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
