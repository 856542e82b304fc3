"""Clean-up of the keys a test wrote to the shared Redis under a prefix of its own."""

from __future__ import annotations

import redis


def drop_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix:``."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(f"{prefix}:*", count=1000):
            client.delete(key)
    finally:
        client.close()
