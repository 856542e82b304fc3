"""How many tokens go in one ``token`` event, decided per request.

A request says ``{"tokens": N, "ms": M}``, ``"auto"``, or nothing (the server's defaults,
``streaming.coalesce_tokens`` / ``coalesce_ms``: one token an event). ``"auto"`` looks at the
round-trip time of the client's connection: above ``streaming.coalesce_rtt_ms`` an event carries
up to 3 tokens (sent at most 50 ms after the first), otherwise one.

The round-trip time is the kernel's smoothed RTT of the TCP connection (``TCP_INFO`` on Linux),
read from the socket the request came in on. Behind a proxy that is the proxy's connection, not
the client's: a nearby proxy makes every client look close (``auto`` then sends one token an
event), and the client's own distance is invisible. Where no socket is at hand (a unix socket,
another ASGI server, an in-process client), the RTT is unknown and ``auto`` sends one token an
event. The source is a function of the ASGI scope, so tests (or a deployment that knows better,
e.g. from a header its proxy sets) can supply their own.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

from starlette.types import Scope, Send

from rag_stream.schemas.generate import Coalesce
from rag_stream.settings import StreamingSettings

RttSource = Callable[[Scope], float | None]  # milliseconds, None when unknown

AUTO_SLOW = Coalesce(tokens=3, ms=50)
SOCKET_KEY = "rag_stream.socket"
# struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit fields; tcpi_rtt (µs) is the
# 16th of those.
_TCPI_RTT_OFFSET = 8 + 15 * 4


def remember_socket(scope: Scope, send: Send) -> None:
    """Keep the request's socket in its scope, when the server lets us find it.

    Uvicorn hands the app its connection's bound ``send``, whose owner holds the asyncio
    transport; nothing in ASGI names the socket otherwise."""
    transport: Any = getattr(getattr(send, "__self__", None), "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        scope[SOCKET_KEY] = sock


def kernel_rtt_ms(scope: Scope) -> float | None:
    """The kernel's smoothed round-trip time of the request's TCP connection."""
    sock = scope.get(SOCKET_KEY)
    tcp_info = getattr(socket, "TCP_INFO", None)
    if sock is None or tcp_info is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 104)
    except OSError:
        return None
    if len(info) < _TCPI_RTT_OFFSET + 4:
        return None
    (rtt_us,) = struct.unpack_from("I", info, _TCPI_RTT_OFFSET)
    return float(rtt_us) / 1000


class CoalescePolicy:
    def __init__(self, cfg: StreamingSettings, rtt_source: RttSource = kernel_rtt_ms) -> None:
        self._cfg = cfg
        self._rtt = rtt_source

    def resolve(self, option: Coalesce | str | None, scope: Scope) -> Coalesce:
        """The rule for one request (``option`` as the request gave it)."""
        if isinstance(option, Coalesce):
            return option
        if option == "auto":
            rtt = self._rtt(scope)
            slow = rtt is not None and rtt > self._cfg.coalesce_rtt_ms
            return AUTO_SLOW if slow else Coalesce()
        return Coalesce(tokens=self._cfg.coalesce_tokens, ms=self._cfg.coalesce_ms)
