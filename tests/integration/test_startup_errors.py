"""Bad settings stop `rag-stream serve` with one line naming the setting, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import ROOT, free_port


def _serve(tmp_path: Path, models_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "RAG_STREAM_DATA_DIR": str(tmp_path),
        "RAG_STREAM_MODELS_DIR": str(models_dir),
        "RAG_STREAM_PORT": str(free_port()),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "rag_stream", "serve"],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RAG_STREAM_PROFILE": "staging"}, "RAG_STREAM_PROFILE: unknown profile 'staging'"),
        ({"RAG_STREAM_REDIS_URL": "redis://127.0.0.1:1/0"}, "RAG_STREAM_REDIS_URL: cannot reach"),
        (
            {"RAG_STREAM_MODEL": "/nonexistent/model"},
            "RAG_STREAM_MODEL: model path /nonexistent/model does not exist",
        ),
        ({"RAG_STREAM_EMBEDDER": "./no-such-embedder"}, "RAG_STREAM_EMBEDDER: model path"),
        ({"RAG_STREAM_DTYPE": "fp8"}, "RAG_STREAM_DTYPE: Input should be"),
        (
            {"RAG_STREAM_PORT": "70000"},
            "RAG_STREAM_PORT: Input should be less than or equal to 65535",
        ),
        (
            {"RAG_STREAM_DATABASE_URL": "postgresql+asyncpg://postgres@127.0.0.1:1/test"},
            "RAG_STREAM_DATABASE_URL: migration failed",
        ),
    ],
)
def test_bad_setting_stops_startup_with_one_line(
    tmp_path: Path, models_dir: Path, env: dict[str, str], expected: str
) -> None:
    result = _serve(tmp_path, models_dir, **env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "configuration error" in line]
    assert len(errors) == 1, result.stderr
    assert expected in errors[0]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, ["ENGINE_URLS", "QDRANT_URL", "REDIS_URL"]),
        (
            {"RAG_STREAM_ENGINE_URLS": "http://127.0.0.1:1", "RAG_STREAM_REDIS_URL": "redis://x"},
            ["QDRANT_URL"],
        ),
    ],
)
def test_several_workers_are_refused_while_a_part_belongs_to_one_process(
    tmp_path: Path, models_dir: Path, env: dict[str, str], named: list[str]
) -> None:
    full = {**os.environ, "RAG_STREAM_DATA_DIR": str(tmp_path), **env}
    result = subprocess.run(
        [sys.executable, "-m", "rag_stream", "serve", "--workers", "2"],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("rag-stream: configuration error: --workers 2 needs parts")
    for name in ["ENGINE_URLS", "QDRANT_URL", "REDIS_URL"]:
        assert (f"RAG_STREAM_{name}" in line) == (name in named), line
