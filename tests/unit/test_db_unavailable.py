"""Which database errors are a 503 ``database_unavailable`` (the stream's save waits and
retries them, store/db.py ``retrying``) rather than a bug."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi as dbapi
from sqlalchemy.exc import DBAPIError

from rag_stream.store.db import unavailable


def _as_sqlalchemy_raises(driver_error: Exception) -> DBAPIError:
    """What SQLAlchemy raises for an error asyncpg gave while connecting: its dialect wraps it
    in the adapted DB-API ``Error``, and that in a ``DBAPIError``."""
    adapted = dbapi.Error(str(driver_error), driver_error)
    adapted.__cause__ = driver_error
    return DBAPIError.instance(None, None, adapted, dbapi.Error)


@pytest.mark.parametrize(
    "driver_error",
    [
        # PostgreSQL just restarted: seen under a stream ending while it came back up
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator"),
        asyncpg.exceptions.ConnectionFailureError("connection failure"),
    ],
)
def test_a_server_refusing_connections_for_now_is_unavailable(driver_error: Exception) -> None:
    error = _as_sqlalchemy_raises(driver_error)
    found = unavailable(error)
    assert found is not None and found.status_code == 503, error


def test_a_bad_query_is_not_unavailable() -> None:
    error = _as_sqlalchemy_raises(asyncpg.exceptions.UndefinedTableError("no such table"))
    assert unavailable(error) is None
