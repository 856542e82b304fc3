"""GET /v1/usage: the caller's tenant's tokens and requests over a period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from rag_stream.api.deps import SessionDep, TenantDep
from rag_stream.errors import InvalidRequest
from rag_stream.schemas.tenants import UsageOut, UsageTotals
from rag_stream.store.streams import usage_by_kind

router = APIRouter(tags=["usage"])

_DEFAULT_PERIOD = timedelta(days=30)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@router.get("/v1/usage")
async def usage(
    session: SessionDep,
    tenant: TenantDep,
    from_: Annotated[
        datetime | None,
        Query(alias="from", description="ISO 8601, inclusive (default: `to` minus 30 days)"),
    ] = None,
    to: Annotated[
        datetime | None, Query(description="ISO 8601, exclusive (default: now); UTC if no offset")
    ] = None,
) -> UsageOut:
    """Streams of the caller's tenant that ended in [from, to): requests and tokens, in total
    and per kind of stream (``answer``, ``generate``)."""
    end = _utc(to) if to else datetime.now(UTC)
    start = _utc(from_) if from_ else end - _DEFAULT_PERIOD
    if start > end:
        raise InvalidRequest("from must not be after to", param="from")
    by_kind = await usage_by_kind(session, tenant, start, end)
    total = UsageTotals(
        **{f: sum(getattr(u, f) for u in by_kind.values()) for f in UsageTotals.model_fields}
    )
    return UsageOut(tenant=tenant, from_=start, to=end, total=total, by_kind=by_kind)
