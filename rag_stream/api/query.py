"""Query parameters read as strictly as the JSON bodies.

A query string is text, so pydantic reads it in lax mode: ``limit=+1``, ``1_0``, ``1.0`` or
`` 1`` pass as the integer 1 or 10, and a datetime takes ``to=0.5`` as a Unix timestamp. These
types keep the schema the same (an integer, a ``date-time``) and refuse what it does not
describe, with a 422 naming the parameter.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import BeforeValidator

# ASCII digits only, as the last_event_id cursor (api/cursor.py): no sign but "-", no "_".
_INTEGER = re.compile(r"-?[0-9]+")
# ISO 8601 starts with the calendar date; a number (a Unix timestamp to pydantic) does not.
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _integer(value: object) -> object:
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        raise ValueError(f"must be an integer in ASCII digits, got {value[:40]!r}")
    return value


def _iso_datetime(value: object) -> object:
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError(
            f"must be an ISO 8601 date and time (2026-01-31T12:00:00Z), got {value[:40]!r}"
        )
    return value


def _boolean(value: object) -> object:
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError(f"must be true or false, got {value[:40]!r}")
    return value


QueryInt = Annotated[int, BeforeValidator(_integer)]
QueryDatetime = Annotated[datetime, BeforeValidator(_iso_datetime)]
QueryBool = Annotated[bool, BeforeValidator(_boolean)]
