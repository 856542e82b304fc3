"""GET /v1/usage: the caller's tenant's tokens and requests over a period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from rag_stream.api.deps import SessionDep, TenantDep
from rag_stream.api.query import QueryDatetime
from rag_stream.errors import InvalidRequest
from rag_stream.schemas.tenants import UsageOut, UsageTotals
from rag_stream.store.streams import usage_by_kind

router = APIRouter(tags=["usage"])

_DEFAULT_PERIOD = timedelta(days=30)
_FIRST = datetime.min.replace(tzinfo=UTC)


def _utc(moment: datetime, param: str) -> datetime:
    """In UTC; a moment at the ends of the calendar may have no UTC time (0001-01-01 at +01:00
    is in year 0): a 422, not an OverflowError."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise InvalidRequest(
            f"{param} is outside the years 1 to 9999 in UTC", param=param
        ) from None


@router.get("/v1/usage")
async def usage(
    session: SessionDep,
    tenant: TenantDep,
    from_: Annotated[
        QueryDatetime | None,
        Query(alias="from", description="ISO 8601, inclusive (default: `to` minus 30 days)"),
    ] = None,
    to: Annotated[
        QueryDatetime | None,
        Query(description="ISO 8601, exclusive (default: now); UTC if no offset"),
    ] = None,
) -> UsageOut:
    """Streams of the caller's tenant that ended in [from, to): requests and tokens, in total
    and per kind of stream (``answer``, ``generate``)."""
    end = _utc(to, "to") if to else datetime.now(UTC)
    # (the default period stops at the first day of year 1)
    start = _utc(from_, "from") if from_ else max(end, _FIRST + _DEFAULT_PERIOD) - _DEFAULT_PERIOD
    if start > end:
        raise InvalidRequest("from must not be after to", param="from")
    by_kind = await usage_by_kind(session, tenant, start, end)
    total = UsageTotals(
        **{f: sum(getattr(u, f) for u in by_kind.values()) for f in UsageTotals.model_fields}
    )
    return UsageOut(tenant=tenant, from_=start, to=end, total=total, by_kind=by_kind)
