"""Tenants and API keys as they cross boundaries (the CLI, the API, stream meta in Redis).

A tenant is a name. Everything a client creates (knowledge bases with their documents,
conversations, streams) belongs to the tenant of the key it used; a server without keys runs
open, as the single tenant ``local`` (see ``api/auth.py``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

LOCAL_TENANT = "local"

TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class ApiKeyOut(BaseModel):
    """An API key as listed: never the key itself, which is shown once, at creation."""

    id: str
    tenant: str
    name: str | None
    prefix: str  # the key's first characters, to tell keys apart
    created_at: datetime
    revoked_at: datetime | None


class CreatedKey(ApiKeyOut):
    key: str  # the secret: stored nowhere, shown once


class UsageTotals(BaseModel):
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class UsageOut(BaseModel):
    """GET /v1/usage: the caller's tenant, streams that ended in [from, to)."""

    model_config = ConfigDict(populate_by_name=True)

    tenant: str
    from_: datetime = Field(alias="from")
    to: datetime
    total: UsageTotals
    by_kind: dict[str, UsageTotals]
