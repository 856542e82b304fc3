"""API keys: created (shown once), listed, revoked, and checked on every request.

A key reads ``rsk_<id>_<secret>``: the id finds the row, and the SHA-256 of the whole key is
compared with the stored one in constant time, so neither a lookup nor a comparison leaks how
much of a guess was right. Only the hash and a short prefix are stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import NotFound, Unauthorized
from rag_stream.schemas.tenants import LOCAL_TENANT, ApiKeyOut, CreatedKey
from rag_stream.store.models import ApiKey, utcnow

_SCHEME = "rsk"
_PREFIX_CHARS = 12  # "rsk_" and the first characters of the id: enough to tell keys apart


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def _out(row: ApiKey) -> ApiKeyOut:
    return ApiKeyOut.model_validate(row, from_attributes=True)


async def create_key(session: AsyncSession, tenant: str, name: str | None) -> CreatedKey:
    key_id = secrets.token_hex(8)
    key = f"{_SCHEME}_{key_id}_{secrets.token_urlsafe(32)}"
    row = ApiKey(
        id=key_id,
        tenant=tenant,
        name=name,
        key_hash=_digest(key),
        prefix=key[:_PREFIX_CHARS],
        created_at=utcnow(),
    )
    session.add(row)
    await session.commit()
    return CreatedKey(**_out(row).model_dump(), key=key)


async def list_keys(session: AsyncSession) -> list[ApiKeyOut]:
    rows = await session.scalars(select(ApiKey).order_by(ApiKey.tenant, ApiKey.created_at))
    return [_out(r) for r in rows]


async def revoke_key(session: AsyncSession, key_id: str) -> ApiKeyOut:
    row = await session.get(ApiKey, key_id)
    if row is None:
        raise NotFound(f"no API key with id {key_id!r} (rag-stream keys list shows them)")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        await session.commit()
    return _out(row)


async def any_key(session: AsyncSession) -> bool:
    """Whether a key was ever created (a revoked one counts: keys stay required)."""
    return await session.scalar(select(ApiKey.id).limit(1)) is not None


@dataclass(frozen=True)
class KeyOwner:
    key_id: str
    tenant: str


async def authenticate(session: AsyncSession, key: str) -> KeyOwner | None:
    """The live key's id and tenant, or None for a wrong, unknown or revoked key."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != _SCHEME or len(parts[1]) != 16:
        return None
    row = await session.get(ApiKey, parts[1])
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.key_hash, _digest(key)):
        return None
    return KeyOwner(row.id, row.tenant)


class KeyRing:
    """Who is calling: the owner of the request's key, or the open mode's tenant.

    Open (no key needed, every caller is tenant ``local``) only while no key was ever created
    and ``always_required`` is off; the first ``rag-stream keys create`` closes it, in a running
    server too, within ``OPEN_RECHECK_S`` (a process that has seen a key never checks again).
    While open, one query at a time asks, and its answer serves every request for that long:
    a query per request made a thousand requests at once wait for the database pool, and some
    time out."""

    OPEN_RECHECK_S = 1.0

    def __init__(self, sessions: async_sessionmaker[AsyncSession], always_required: bool) -> None:
        self._sessions = sessions
        self._required = always_required
        self._open_until = 0.0  # monotonic time until which "no key yet" holds
        self._asking = asyncio.Lock()

    async def required(self) -> bool:
        if self._required or time.monotonic() < self._open_until:
            return self._required
        async with self._asking:
            if not self._required and time.monotonic() >= self._open_until:
                async with self._sessions() as session:
                    self._required = await any_key(session)
                self._open_until = time.monotonic() + self.OPEN_RECHECK_S
        return self._required

    async def owner(self, key: str | None) -> KeyOwner:
        """The caller of a request that sent ``key`` (None: no Bearer credentials)."""
        if not await self.required():
            return KeyOwner(key_id=LOCAL_TENANT, tenant=LOCAL_TENANT)
        if not key:
            raise Unauthorized("an API key is required: send Authorization: Bearer <key>")
        async with self._sessions() as session:
            found = await authenticate(session, key)
        if found is None:
            raise Unauthorized("the API key is not valid (wrong, unknown or revoked)")
        return found
