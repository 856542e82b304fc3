from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from rag_stream.cli import main
from rag_stream.errors import ConfigError
from rag_stream.settings import PROJECT_ROOT as ROOT
from rag_stream.settings import load_settings
from scripts.settings_reference import (
    env_name,
    field_at,
    profile_values,
    reference,
    render_default,
    settings_fields,
)


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


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ftp://gpu-1:8000", "'ftp://gpu-1:8000' is not an http(s) base URL"),
        ("gpu-1:8000", "'gpu-1:8000' is not an http(s) base URL"),
        ("http://", "'http://' is not an http(s) base URL (empty host)"),
        (
            "http://admin:hunter2@gpu-1:99999",
            "'http://admin:***@gpu-1:99999' is not an http(s) base URL (invalid port number)",
        ),
    ],
)
def test_a_bad_engine_url_is_named_and_quoted_without_its_password(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("RAG_STREAM_ENGINE_URLS", f"http://gpu-0:8000, {value}")
    with pytest.raises(ConfigError) as failure:
        load_settings()
    assert failure.value.message == f"RAG_STREAM_ENGINE_URLS: {message}"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RAG_STREAM_DATABASE_URL", "", "must start with sqlite+aiosqlite:// or"),
        ("RAG_STREAM_DATABASE_URL", "postgresql+asyncpg://u:pw@:5432/db", "(empty host)"),
        ("RAG_STREAM_REDIS_URL", "localhost:6379", "must start with redis://"),
        ("RAG_STREAM_REDIS_URL", "redis://:pw@/0", "not a valid Redis URL (empty host)"),
    ],
)
def test_a_malformed_service_url_is_refused_without_quoting_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as failure:
        load_settings()
    assert failure.value.message.startswith(f"{name}: ")
    assert message in failure.value.message
    assert "pw" not in failure.value.message


def test_service_urls_are_kept_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """pydantic's URL types validate them; their normalised forms would change what the
    engine, SQLAlchemy and redis-py are given."""
    urls = {
        "ENGINE_URLS": "http://gpu-1:8000,https://gpu-2/v1",
        "DATABASE_URL": "sqlite+aiosqlite:///./relative.db",
        "REDIS_URL": "redis://default:p@ss@127.0.0.1:6379/0",
        "KV__REDIS_URL": "unix:///run/redis.sock?db=2",
    }
    for name, value in urls.items():
        monkeypatch.setenv(f"RAG_STREAM_{name}", value)
    settings = load_settings()
    assert settings.engine_urls == ["http://gpu-1:8000", "https://gpu-2/v1"]
    assert settings.database_url == urls["DATABASE_URL"]
    assert settings.redis_url == urls["REDIS_URL"]
    assert settings.kv.redis_url == urls["KV__REDIS_URL"]


@pytest.mark.parametrize(
    "url",
    [
        "sqlite+aiosqlite:////var/lib/rag/rag-stream.db",
        "sqlite+aiosqlite:///:memory:",
        "postgresql+asyncpg://rag:secret@db:5432/rag",
        "postgresql+asyncpg://rag@db-1:5432,db-2:5432/rag",
    ],
)
def test_async_database_urls_are_accepted(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("RAG_STREAM_DATABASE_URL", url)
    assert load_settings().database_url == url


def test_the_kv_connector_uses_its_own_redis_else_the_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAG_STREAM_KV__ENABLED", "true")
    with pytest.raises(ConfigError, match="set RAG_STREAM_KV__REDIS_URL or RAG_STREAM_REDIS_URL"):
        load_settings()
    monkeypatch.setenv("RAG_STREAM_REDIS_URL", "redis://service:6379/0")
    assert load_settings().resolved_kv_redis_url == "redis://service:6379/0"
    monkeypatch.setenv("RAG_STREAM_KV__REDIS_URL", "redis://kv:6379/1")
    assert load_settings().resolved_kv_redis_url == "redis://kv:6379/1"


def test_the_job_command_finds_its_server_as_the_client_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("RAG_STREAM_URL", f"http://127.0.0.1:{port}/")
    assert main(["job", "status", "some-job"]) == 1
    assert f"cannot reach http://127.0.0.1:{port}: " in capsys.readouterr().err


# One source of truth: each setting's description in rag_stream/settings.py, rendered into
# docs/settings.md; the README's table and the profiles are checked against the code.


def test_every_setting_is_described() -> None:
    undescribed = [env_name(path) for path, field in settings_fields() if not field.description]
    assert not undescribed


def test_the_settings_reference_is_current() -> None:
    assert (ROOT / "docs" / "settings.md").read_text(encoding="utf-8") == reference(), (
        "docs/settings.md is stale: run .venv/bin/python scripts/settings_reference.py"
    )


def _readme_table() -> list[tuple[str, str]]:
    """(variable, default) of each row of the README's Configuration table."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(RAG_STREAM_\w+)` \| ([^|]+) \|", section, re.MULTILINE)
    assert len(rows) >= 10, "the README's settings table was not found"
    return [(name, default.strip()) for name, default in rows]


def test_the_readme_table_names_real_settings_with_their_defaults() -> None:
    """A default in backticks is the value a fresh start uses (the code's, or the default
    profile's); a default in words describes what an unset setting means."""
    default_profile = profile_values()["default"]
    for name, stated in _readme_table():
        path = tuple(name.removeprefix("RAG_STREAM_").lower().split("__"))
        field = field_at(path)
        assert field is not None, f"the README names {name}, which is no setting"
        default = default_profile.get(path, field.get_default(call_default_factory=True))
        if stated.startswith("`"):
            assert stated == render_default(default), name
        else:
            assert default in (None, []), f"{name}: the README says {stated!r}, the code {default}"


def test_profiles_hold_only_what_differs_from_the_code() -> None:
    for profile, values in profile_values().items():
        for path, value in values.items():
            field = field_at(path)
            assert field is not None, f"configs/{profile}.yaml: {'.'.join(path)} is no setting"
            default = field.get_default(call_default_factory=True)
            assert TypeAdapter(field.annotation).validate_python(value) != default, (
                f"configs/{profile}.yaml repeats the default of {'.'.join(path)}"
            )
