"""uvicorn's access log without query values.

uvicorn writes each request's whole target, query string included, so a client that puts its
key in the URL (``?api_key=rsk_...``, refused, but only after it is logged) leaves it in every
log the service writes to. Every value is replaced, not only those that look like keys: no rule
about names or shapes can tell every secret a client might send, and the names alone still say
what a request asked (``?limit=***&before=***``).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from uvicorn.config import LOGGING_CONFIG

HIDDEN = "***"


def redact_query(target: str) -> str:
    """``/v1/kbs?api_key=rsk_x&limit=5`` -> ``/v1/kbs?api_key=***&limit=***``. A field with no
    ``=`` is all value (``?rsk_x``), so it is hidden whole."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    fields = []
    for field in query.split("&"):
        name, equals, _ = field.partition("=")
        fields.append(f"{name}={HIDDEN}" if equals else (HIDDEN if field else ""))
    return f"{path}?{'&'.join(fields)}"


class RedactQuery(logging.Filter):
    """On the ``uvicorn.access`` logger, whose records carry (client, method, target, HTTP
    version, status) as their arguments; the formatter builds the line from those."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], redact_query(args[2]), args[3], args[4])
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's own logging set-up with the filter on its access logger (what ``serve`` hands
    uvicorn, so every worker process applies it)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_query"] = {"()": f"{__name__}.RedactQuery"}
    config["loggers"]["uvicorn.access"]["filters"] = ["redact_query"]
    return config
