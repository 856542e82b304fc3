"""The access log's filter (rag_stream/api/access_log.py) hides every query value and keeps the
rest of the line; tests/integration/test_access_log.py reads a real server's log."""

from __future__ import annotations

import logging

import pytest

from rag_stream.api.access_log import RedactQuery, redact_query


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/v1/kbs?api_key=rsk_abc_secret", "/v1/kbs?api_key=***"),
        ("/v1/kbs?limit=5&key=rsk_x&before=j-1", "/v1/kbs?limit=***&key=***&before=***"),
        ("/v1/kbs?rsk_abc_secret", "/v1/kbs?***"),  # a bare field is all value
        ("/v1/kbs?a=&b==c&&", "/v1/kbs?a=***&b=***&&"),
        ("/v1/kbs?", "/v1/kbs?"),
        ("/v1/kbs", "/v1/kbs"),
        ("/v1/kbs/a=b", "/v1/kbs/a=b"),  # the path is left as it is
    ],
)
def test_every_query_value_is_hidden(target: str, logged: str) -> None:
    assert redact_query(target) == logged


def test_the_filter_rewrites_the_target_of_uvicorns_access_records() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/v1/kbs?api_key=rsk_abc_secret", "1.1", 401),
        None,
    )
    assert RedactQuery().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "GET /v1/kbs?api_key=*** HTTP/1.1" 401'


def test_other_records_pass_untouched() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "%s", ("a?b=c",), None)
    assert RedactQuery().filter(record)
    assert record.getMessage() == "a?b=c"
