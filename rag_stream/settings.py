"""All configuration in one place.

Values come, highest priority first, from: explicit keyword arguments (CLI flags), environment
variables prefixed ``RAG_STREAM_`` (nested groups use ``__``, for example
``RAG_STREAM_ENGINE__KV_CACHE_GB``),
the YAML profile named by ``RAG_STREAM_PROFILE`` (``configs/<profile>.yaml``), then the defaults
below. Every embedded default (SQLite, local Qdrant, embedded Redis, prepared models) lives under
``data_dir``; each is replaced by a URL or path for production.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from rag_stream.errors import ConfigError

ENV_PREFIX = "RAG_STREAM_"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_DIR = PROJECT_ROOT / "configs"
DEFAULT_LLM_DIRNAME = "SmolLM2-135M-Instruct"
DEFAULT_EMBEDDER_DIRNAME = "all-MiniLM-L6-v2"

Dtype = Literal["float32", "bfloat16", "float16", "auto"]


class EngineSettings(BaseModel):
    """The in-process vLLM engine."""

    max_model_len: int = Field(4096, ge=256)
    kv_cache_gb: float = Field(1.0, gt=0)
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(32, ge=1)
    # The engine core is a separate process; warm-up takes tens of seconds on CPU.
    startup_timeout_s: float = Field(600.0, gt=0)


class LimitsSettings(BaseModel):
    """Bounds on what a client may ask for."""

    max_prompt_chars: int = Field(32_000, ge=1)
    max_tokens: int = Field(2048, ge=1)
    default_max_tokens: int = Field(256, ge=1)


class StreamingSettings(BaseModel):
    """Server-sent events."""

    keepalive_s: float = Field(15.0, gt=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    profile: str = "default"
    data_dir: Path = Path(".data")
    models_dir: Path | None = None
    database_url: str | None = None
    redis_url: str | None = None
    qdrant_url: str | None = None
    model: str | None = None
    embedder: str | None = None
    dtype: Dtype = "float32"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # False in production: every embedded default must then be replaced by a URL.
    allow_embedded: bool = True

    engine: EngineSettings = EngineSettings()
    limits: LimitsSettings = LimitsSettings()
    streaming: StreamingSettings = StreamingSettings()

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError(
                "must start with sqlite+aiosqlite:// or postgresql+asyncpg:// (async drivers)"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _external_services(self) -> Settings:
        if not self.allow_embedded:
            missing = [
                f"{ENV_PREFIX}{name.upper()}"
                for name in ("database_url", "redis_url", "qdrant_url")
                if getattr(self, name) is None
            ]
            if missing:
                names = ", ".join(missing)
                raise ValueError(
                    f"profile {self.profile!r} allows no embedded services: set {names}"
                )
        return self

    # Resolved values: the embedded defaults all live under data_dir.

    @property
    def resolved_models_dir(self) -> Path:
        return (self.models_dir or self.data_dir / "models").resolve()

    @property
    def resolved_model(self) -> str:
        return self.model or str(self.resolved_models_dir / DEFAULT_LLM_DIRNAME)

    @property
    def resolved_embedder(self) -> str:
        return self.embedder or str(self.resolved_models_dir / DEFAULT_EMBEDDER_DIRNAME)

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'rag-stream.db').resolve()}"

    @property
    def qdrant_path(self) -> Path:
        return (self.data_dir / "qdrant").resolve()

    @property
    def redis_dir(self) -> Path:
        return (self.data_dir / "redis").resolve()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        return (init_settings, env_settings, ProfileSource(settings_cls, init_settings))


def config_dir() -> Path:
    return Path(os.environ.get(f"{ENV_PREFIX}CONFIG_DIR", DEFAULT_CONFIG_DIR))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


class ProfileSource(PydanticBaseSettingsSource):
    """Lowest-priority source: the YAML file of the selected profile."""

    def __init__(self, settings_cls: type[BaseSettings], init: InitSettingsSource) -> None:
        super().__init__(settings_cls)
        self._init = init

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        name = self._init.init_kwargs.get("profile") or os.environ.get(
            f"{ENV_PREFIX}PROFILE", "default"
        )
        path = config_dir() / f"{name}.yaml"
        if not path.is_file():
            choices = ", ".join(available_profiles()) or "none found"
            raise ConfigError(
                f"{ENV_PREFIX}PROFILE: unknown profile {name!r} (choose from {choices})"
            )
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{ENV_PREFIX}PROFILE: {path} must contain a mapping")
        return data


def load_settings(**overrides: Any) -> Settings:
    """Build settings, turning validation failures into one readable ConfigError."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            message = str(err["msg"]).removeprefix("Value error, ")
            if err["loc"]:
                name = ENV_PREFIX + "__".join(str(p) for p in err["loc"]).upper()
                message = f"{name}: {message}"
            parts.append(message)
        raise ConfigError("; ".join(parts)) from None
