from __future__ import annotations

from pathlib import Path

import pytest

from rag_stream.errors import ConfigError
from rag_stream.settings import load_settings


def test_environment_overrides_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_PROFILE", "test")
    monkeypatch.setenv("RAG_STREAM_ENGINE__KV_CACHE_GB", "0.25")
    monkeypatch.setenv("RAG_STREAM_DTYPE", "bfloat16")
    settings = load_settings()
    assert settings.profile == "test"
    assert settings.engine.kv_cache_gb == 0.25
    assert settings.engine.max_model_len == 2048  # from configs/test.yaml
    assert settings.dtype == "bfloat16"


def test_embedded_defaults_live_under_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RAG_STREAM_DATA_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.resolved_database_url == f"sqlite+aiosqlite:///{tmp_path}/rag-stream.db"
    assert settings.qdrant_path == tmp_path / "qdrant"
    assert settings.redis_dir == tmp_path / "redis"
    assert settings.resolved_model == str(tmp_path / "models" / "SmolLM2-135M-Instruct")


def test_unknown_profile_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_PROFILE", "nope")
    with pytest.raises(
        ConfigError,
        match=r"RAG_STREAM_PROFILE: unknown profile 'nope' \(choose from default, production, "
        r"test\)",
    ):
        load_settings()


def test_bad_dtype_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_DTYPE", "int3")
    with pytest.raises(ConfigError, match="RAG_STREAM_DTYPE: Input should be"):
        load_settings()


def test_nested_bad_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_ENGINE__MAX_MODEL_LEN", "10")
    with pytest.raises(ConfigError, match="RAG_STREAM_ENGINE__MAX_MODEL_LEN"):
        load_settings()


def test_sync_database_driver_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_DATABASE_URL", "postgresql://x@y/z")
    with pytest.raises(ConfigError, match=r"RAG_STREAM_DATABASE_URL: .*async drivers"):
        load_settings()


def test_production_profile_requires_external_services(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_PROFILE", "production")
    monkeypatch.setenv("RAG_STREAM_REDIS_URL", "redis://r:6379/0")
    with pytest.raises(ConfigError, match="set RAG_STREAM_DATABASE_URL, RAG_STREAM_QDRANT_URL"):
        load_settings()


def test_profile_keyword_beats_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_PROFILE", "default")
    settings = load_settings(profile="test")
    assert settings.profile == "test"
    assert settings.engine.max_model_len == 2048  # from configs/test.yaml


def test_profile_that_is_not_a_mapping_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken.yaml").write_text("- ab\n- cd\n")
    monkeypatch.setenv("RAG_STREAM_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("RAG_STREAM_PROFILE", "broken")
    with pytest.raises(
        ConfigError, match=r"^RAG_STREAM_PROFILE: .*broken\.yaml must contain a mapping$"
    ):
        load_settings()


@pytest.mark.parametrize("name", ["RAG_STREAM_REDIS_URL", "RAG_STREAM_KV__REDIS_URL"])
def test_redis_urls_need_a_redis_scheme(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "http://127.0.0.1:6379")
    with pytest.raises(
        ConfigError, match=f"^{name}: must start with redis://, rediss:// or unix://$"
    ):
        load_settings()
