"""Host parsing and the default trusted hosts of the browser guard."""

from __future__ import annotations

import pytest

from rag_stream.api.browser_guard import LOOPBACK_NAMES, default_trusted_hosts, host_name


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("LOCALHOST", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("evil.example", "evil.example"),
        ("", ""),
    ],
)
def test_host_names(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    "header",
    [
        "localhost:80@evil.example",  # a trusted name, then something else
        "127.0.0.1:8000/evil.example",
        "[::1]evil.example",
        "localhost:abc",
        "localhost evil.example",
        "::1",  # IPv6 is bracketed in Host
        "localhost\\evil.example",
    ],
)
def test_a_header_that_is_not_host_and_port_names_no_host(header: str) -> None:
    assert host_name(header) == ""


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.1.2.3", "::1", "localhost"])
def test_loopback_listeners_trust_loopback_names_only(listen: str) -> None:
    assert default_trusted_hosts(listen) == list(LOOPBACK_NAMES)


@pytest.mark.parametrize("listen", ["0.0.0.0", "10.1.2.3", "my-host"])
def test_other_listeners_trust_any_name_by_default(listen: str) -> None:
    assert default_trusted_hosts(listen) is None
