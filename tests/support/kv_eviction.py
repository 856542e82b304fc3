"""Asking a probe engine to lose a KV block between the match and the load.

``EvictingKVConnector`` (``tests.support.evicting_kv_connector``) does it for requests whose id
starts with ``EVICT_PREFIX``. vLLM imports it by name in the engine processes; this module
names it without importing it, so that a test process never imports vLLM and torch.
"""

from __future__ import annotations

import os

from tests.support.server import ROOT

EVICT_PREFIX = "evict-"
CONNECTOR = "EvictingKVConnector"
MODULE = "tests.support.evicting_kv_connector"


def probe_args() -> list[str]:
    """``rag_stream.kv.probe`` arguments that load the evicting connector."""
    return ["--kv-connector", CONNECTOR, "--kv-connector-module", MODULE]


def probe_env() -> dict[str, str]:
    """The repository root on the import path of the probe and the engine processes it spawns."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}
