"""All configuration in one place.

Values come, highest priority first, from: explicit keyword arguments (CLI flags), environment
variables prefixed ``RAG_STREAM_`` (nested groups use ``__``, for example
``RAG_STREAM_ENGINE__KV_CACHE_GB``),
the YAML profile named by ``RAG_STREAM_PROFILE`` (``configs/<profile>.yaml``, holding only what
differs from the code), then the defaults below. Every embedded default (SQLite, local Qdrant,
embedded Redis, prepared models) lives under ``data_dir``; each is replaced by a URL or path for
production.

Each setting's ``description`` is its documentation: ``scripts/settings_reference.py`` renders
them into docs/settings.md, and a unit test fails when that file is stale.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AnyUrl,
    BaseModel,
    Field,
    HttpUrl,
    TypeAdapter,
    UrlConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import MultiHostUrl
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


def bundled(folder: str) -> Path:
    """A folder of data the package carries: ``configs`` (the profiles), ``migrations`` or
    ``docs`` (the sample KB). An installed package has its copy inside (pyproject.toml maps the
    checkout's top-level folders there); a source checkout, editable install included, has the
    folder at its top."""
    inside = resources.files("rag_stream").joinpath(folder)
    return inside if isinstance(inside, Path) and inside.is_dir() else PROJECT_ROOT / folder


DEFAULT_CONFIG_DIR = bundled("configs")
DEFAULT_LLM_DIRNAME = "SmolLM2-135M-Instruct"
DEFAULT_EMBEDDER_DIRNAME = "all-MiniLM-L6-v2"

Dtype = Literal["float32", "bfloat16", "float16", "auto"]
EmbedderBackend = Literal["auto", "torch", "onnx"]

# pydantic's parse errors that mean "no scheme at all": reported as a wrong scheme.
_NO_SCHEME = ("relative URL without a base", "input is empty")


class UrlCheck:
    """Checks a URL against one of pydantic's URL types and keeps the text as written.

    pydantic's URL types would normalise it (``http://h:8000`` gains a ``/``, ``p@ss`` becomes
    ``p%40ss``, ``///./x.db`` loses its ``./``), and every user of these settings wants the
    string it was given. ``label`` names the kind of URL in docs/settings.md; ``wrong_scheme``
    and ``invalid`` are the messages (``{url}``: the value, its password hidden; ``{reason}``:
    the parser's).
    """

    def __init__(self, label: str, url_type: Any, wrong_scheme: str, invalid: str) -> None:
        self.label = label
        self._wrong_scheme = wrong_scheme
        self._invalid = invalid
        self._adapter: TypeAdapter[Any] = TypeAdapter(url_type)

    def __call__(self, value: str) -> str:
        try:
            self._adapter.validate_python(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            reason = str(error.get("ctx", {}).get("error", error["msg"]))
            try:
                url = repr(without_password(value, value))
            except ValueError:  # urlsplit's refusal (a broken IPv6 host)
                url = "the URL"
            if error["type"] == "url_scheme" or reason in _NO_SCHEME:
                raise ValueError(self._wrong_scheme.format(url=url)) from None
            raise ValueError(self._invalid.format(url=url, reason=reason)) from None
        return value


RedisUrl = Annotated[
    str,
    AfterValidator(
        UrlCheck(
            "Redis URL",
            Annotated[AnyUrl, UrlConstraints(allowed_schemes=["redis", "rediss", "unix"])],
            "must start with redis://, rediss:// or unix://",
            "not a valid Redis URL ({reason})",
        )
    ),
]
DatabaseUrl = Annotated[
    str,
    AfterValidator(
        UrlCheck(
            "SQLAlchemy URL with an async driver",
            # MultiHostUrl, as pydantic's PostgresDsn: PostgreSQL may list several hosts
            Annotated[
                MultiHostUrl,
                UrlConstraints(allowed_schemes=["sqlite+aiosqlite", "postgresql+asyncpg"]),
            ],
            "must start with sqlite+aiosqlite:// or postgresql+asyncpg:// (async drivers)",
            "not a valid database URL ({reason})",
        )
    ),
]
EngineUrl = Annotated[
    str,
    AfterValidator(
        UrlCheck(
            "http(s) base URL",
            HttpUrl,
            "{url} is not an http(s) base URL",
            "{url} is not an http(s) base URL ({reason})",
        )
    ),
]


class EngineSettings(BaseModel):
    """The in-process vLLM engine, and the replicas of ``engine_urls``."""

    max_model_len: int = Field(
        4096, ge=256, description="Longest sequence (prompt and output tokens) the engine holds."
    )
    kv_cache_gb: float = Field(
        1.0, gt=0, description="Memory vLLM sets aside for its KV cache, in GiB."
    )
    enforce_eager: bool = Field(
        True,
        description="Run the model eagerly, without CUDA graphs or compilation: a quicker start "
        "and less memory, at some speed on a GPU.",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="Reuse the KV blocks of a prompt prefix seen before (a conversation's "
        "history, a system prompt).",
    )
    max_num_seqs: int = Field(32, ge=1, description="Sequences the engine runs in one batch.")
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="The order in which requests waiting for the engine are taken: `priority` "
        "takes interactive ones before batch ones (see limits.long_prompt_tokens), `fcfs` takes "
        "them as they came, whatever their class.",
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Prompt and output tokens the engine computes in one step; unset: vLLM's "
        "default (2048 here). A long prefill is split into steps of this size and every running "
        "request waits for each step, so a smaller value bounds interactive latency behind batch "
        "prefills, at some throughput.",
    )
    cpu_executor: Literal["uni", "mp"] = Field(
        "uni",
        description="How vLLM runs the model on a CPU (no effect on a GPU). `uni`: inside vLLM's "
        "engine-core process, on cpu_threads threads. `mp` (vLLM's own CPU default): a worker "
        "process with its threads bound to the first cores, which the engine core spins on, and "
        "one more process to start. On 2 cores with SmolLM2, one thread each, `uni` decodes as "
        "fast on half the engine CPU per token and starts on 0.72x the CPU (docs/benchmarks.md); "
        "`mp` pays on many-core servers with vLLM's per-NUMA-node binding.",
    )
    cpu_threads: int = Field(
        2,
        ge=1,
        description="Threads the model runs on with cpu_executor `uni`. A RAG prompt is mostly "
        "prefill, which scales with threads: on 2 cores, 2 threads gave answers their first "
        "token in 0.52-0.66x the time and their last in 0.69-0.84x (docs/benchmarks.md, 'Engine "
        "threads'). On a larger server, the cores the engine may have, leaving one to the API "
        "process.",
    )
    replica_max_waiting: int = Field(
        8,
        ge=0,
        description="With engine_urls: a replica with more requests waiting than this is passed "
        "over for the least-loaded one.",
    )
    replica_health_s: float = Field(
        2.0,
        gt=0,
        description="With engine_urls: how often each replica's health and load are polled.",
    )
    replica_routing: Literal["affinity", "round_robin"] = Field(
        "affinity",
        description="With engine_urls: `affinity` keeps a conversation (or a prompt's first KV "
        "block) on one replica, where its prefix is cached; `round_robin` sends each request to "
        "the next healthy replica (to compare, or for traffic without shared prefixes).",
    )

    speculative: Literal["off", "ngram"] = Field(
        "ngram",
        description="Speculative decoding in the in-process engine. `ngram` (prompt lookup): "
        "vLLM drafts the next tokens by finding the last few generated ones in the prompt and "
        "checks the drafts in one step, so text copied from the sources comes faster (answers "
        "about 2x to the last token on CPU, docs/benchmarks.md); greedy text, takeovers "
        "included, is the same as without it. `off`: one token a step. vLLM replicas "
        "(engine_urls) take vLLM's own `--speculative-config` instead (docs/deploy.md).",
    )
    speculative_tokens: int = Field(
        4, ge=1, le=16, description="With speculative `ngram`: tokens drafted a step."
    )
    prompt_lookup_min: int = Field(
        2, ge=1, description="With speculative `ngram`: the shortest n-gram looked up."
    )
    prompt_lookup_max: int = Field(
        4, ge=1, description="With speculative `ngram`: the longest n-gram looked up."
    )

    @model_validator(mode="after")
    def _lookup_window(self) -> EngineSettings:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self

    def speculative_config(self) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` for these settings (None: off)."""
        if self.speculative == "off":
            return None
        return {
            "method": self.speculative,
            "num_speculative_tokens": self.speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
        }

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
    """Bounds on what a client may ask for, and on the load a process accepts."""

    max_prompt_chars: int = Field(
        32_000, ge=1, description="Longest prompt a generate request accepts, in characters."
    )
    max_tokens: int = Field(
        2048, ge=1, description="The most tokens a request may ask the model to write."
    )
    default_max_tokens: int = Field(
        256, ge=1, description="Tokens the model may write when a request does not say."
    )
    body_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="The longest wait for the next piece of a request body; a client that sends "
        "its headers and then stalls would otherwise hold a connection indefinitely.",
    )
    body_deadline_s: float = Field(
        120.0,
        gt=0,
        description="The longest a whole request body may take to arrive, from the service's "
        "first read of it: body_read_timeout_s bounds each wait, so a client sending a byte at "
        "a time would otherwise hold its request open indefinitely. At 120 s an upload of "
        "ingest.max_upload_bytes (20 MiB) needs about 175 KiB/s; raise it for larger uploads "
        "or slower clients.",
    )
    header_timeout_s: float = Field(
        20.0,
        gt=0,
        description="The longest a request's line and headers may take to arrive, from the first "
        "byte the connection sends after its previous response (`serve` sets it on uvicorn, "
        "which has no such limit; a connection that sends nothing is closed after "
        "keep_alive_s).",
    )
    max_active_streams: int = Field(
        64,
        ge=1,
        description="Streams this process generates at once (streaming/admission.py). Beyond "
        "these and max_queued a request gets a 429 with Retry-After before any work is done.",
    )
    max_queued: int = Field(
        256,
        ge=0,
        description="Streams accepted but waiting for a generating slot (interactive before "
        "batch).",
    )
    retry_after_s: int = Field(
        2, ge=1, description="The Retry-After a 429 for too many streams or requests carries."
    )
    max_active_batch: int | None = Field(
        2,
        ge=1,
        description="How many of the generating streams may be batch ones; unset: any number. "
        "Each batch stream's prefills and decodes share every engine step with the interactive "
        "ones: with 2, interactive TTFT under a batch load stayed within 1.4x of idle "
        "(docs/benchmarks.md).",
    )
    long_prompt_tokens: int = Field(
        2048,
        ge=1,
        description="A prompt of at least this many tokens runs as batch whatever the request "
        "asked: its prefill holds the engine for long, so it waits behind interactive requests.",
    )
    long_prompt_interactive_tenants: list[str] = Field(
        [], description="Tenants whose long prompts stay interactive."
    )
    per_tenant_active: int | None = Field(
        None,
        ge=1,
        description="Streams one tenant generates at once, across every process sharing the "
        "Redis; unset: no limit.",
    )
    requests_per_minute: int | None = Field(
        None,
        ge=1,
        description="Requests one API key (or the open mode's tenant) makes per minute, across "
        "every process sharing the Redis; unset: no limit.",
    )


class AnswersSettings(BaseModel):
    """POST /v1/answers (and the chat endpoint's knowledge-base answers)."""

    overlap: bool = Field(
        True,
        description="Prefill the stable part of the prompt (system, history, question) while "
        "retrieval runs.",
    )
    default_top_k: int = Field(
        4, ge=1, description="Chunks retrieved for a question when the request does not say."
    )
    max_top_k: int = Field(20, ge=1, description="The most chunks a request may ask for.")
    history_budget_tokens: int = Field(
        1024,
        ge=0,
        description="Tokens of conversation history a prompt keeps: the newest turns that fit, "
        "whole user/assistant pairs at a time.",
    )
    max_question_chars: int = Field(
        4000, ge=1, description="Longest question accepted, in characters."
    )


class JobsSettings(BaseModel):
    """Long-document generation jobs (POST /v1/jobs)."""

    max_sections: int = Field(
        30, ge=1, le=100, description="The most sections a job's outline may have."
    )
    default_section_tokens: int = Field(
        256, ge=16, description="Tokens a section may take when the request does not say."
    )
    max_section_tokens: int = Field(
        1024, ge=16, description="The most tokens a request may give a section."
    )
    tail_tokens: int = Field(
        128,
        ge=0,
        description="Tokens from the end of the previous section that a section's prompt "
        "repeats, for continuity.",
    )
    default_top_k: int = Field(
        3, ge=0, description="Chunks retrieved per section when the request does not say."
    )
    max_top_k: int = Field(
        20, ge=0, description="The most chunks per section a request may ask for."
    )
    max_title_chars: int = Field(300, ge=1, description="Longest job title, in characters.")
    max_instructions_chars: int = Field(
        2000, ge=0, description="Longest instructions a job may carry, in characters."
    )
    max_heading_chars: int = Field(
        200, ge=1, description="Longest section heading, given or planned, in characters."
    )
    outline_tokens: int = Field(
        200,
        ge=16,
        description="Tokens the model may write when it plans an outline (one heading a line).",
    )

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

    keepalive_s: float = Field(
        15.0, gt=0, description="A silent stream sends a keep-alive comment this often."
    )
    checkpoint: bool = Field(
        True,
        description="Write streams to the Redis event log. Off only to measure the SSE layer "
        "without Redis: streams then cannot be resumed or taken over.",
    )
    key_prefix: str = Field("rs", description="Prefix of the event log's Redis keys.")
    coalesce_tokens: int = Field(
        1,
        ge=1,
        le=64,
        description="Tokens per `token` event when a request does not say (with coalesce_ms 0: "
        "one token an event).",
    )
    coalesce_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="The longest an event waits for more tokens when a request does not say.",
    )
    coalesce_rtt_ms: float = Field(
        100.0,
        ge=0,
        description='The round-trip time above which `"coalesce": "auto"` sends up to 3 tokens '
        "an event (at most 50 ms after the first), otherwise one.",
    )
    flush_interval_ms: float = Field(
        0.0,
        ge=0,
        description="Extra wait before a flush to the log, to gather more events into it. At 0 a "
        "flush goes as soon as the event loop is free, and events still gather while one is in "
        "flight (group commit): a busy process sends one round trip per engine step for all its "
        "streams, an idle one adds no delay.",
    )
    flush_max_events: int = Field(32, ge=1, description="The most events in one flush.")
    append_max_events: int = Field(
        512,
        ge=1,
        description="The most events of one stream in one append. A writer that buffered many "
        "while the log stalled (Redis slow or restarting) catches up in steps of this size, "
        "where one script call with all of them would stall Redis for everyone.",
    )
    lease_ms: int = Field(
        3000,
        ge=500,
        description="How long a producer's claim on its stream lasts unless renewed; a stream "
        "whose lease ran out is taken over by another process.",
    )
    renew_interval_s: float = Field(
        1.0, gt=0, description="A producer renews its lease at least this often."
    )
    tail_block_ms: int = Field(
        100,
        ge=10,
        description="Readers of streams produced elsewhere share one blocking read per process, "
        "issued again at least this often to pick up newly followed streams.",
    )
    dead_check_ms: int = Field(
        250,
        ge=10,
        description="How often a quiet stream's producer is checked (one check per stream per "
        "process): a dead one, its presence in Redis gone, is taken over at once, without "
        "waiting for its lease.",
    )
    sweep_interval_s: float = Field(
        2.0,
        gt=0,
        description="How often each process announces itself in Redis and takes over running "
        "streams that no live process produces.",
    )
    abandon_after_s: float = Field(
        30.0,
        ge=0,
        description="A stream (not a detached job) that no reader anywhere has followed for this "
        "long stops generating; 0: never.",
    )
    chat_abandon_after_s: float = Field(
        3.0,
        ge=0,
        description="A chat-completions stream stops this long after its last reader left, "
        "unless one comes back: the Stop of chat clients that can only close the connection "
        "(a reconnect within it resumes); 0: as other streams (abandon_after_s).",
    )
    retention_s: int = Field(
        3600,
        ge=1,
        description="How long a finished stream's log stays readable (then its id answers 404).",
    )
    redis_retries: int = Field(
        3,
        ge=0,
        description="Times a write a stream cannot go on without (append, plan, end) is sent "
        "again while Redis fails.",
    )
    redis_pool_size: int = Field(
        64,
        ge=4,
        description="Redis connections of this process. Waiting readers hold none (see "
        "feeds.py); the appends of all its streams keep one for good, and the streams' other "
        "writes (creation, plan, end) another (script_line.py); every other command borrows "
        "one for milliseconds: this bounds concurrency, not streams. When all are busy a "
        "command waits for one.",
    )
    redis_pool_timeout_s: float = Field(
        5.0, gt=0, description="The longest a command waits for a free Redis connection."
    )


class SecuritySettings(BaseModel):
    """What browsers and callers may do (see api/browser_guard.py)."""

    cors_origins: list[str] = Field(
        [],
        description="Web origins (scheme://host[:port]) whose pages may call the API: they get "
        "CORS headers and may send state-changing requests. Empty: only pages this server "
        "serves itself.",
    )
    trusted_hosts: list[str] | None = Field(
        None,
        description="Host names the server answers to (a DNS-rebinding guard). "
        "Unset: the loopback names when it listens on a loopback address, any name otherwise.",
    )
    metrics: Literal["open", "loopback", "key", "off"] = Field(
        "key",
        description="Who may read /metrics: callers with an API key once keys are required "
        "(`key`: anyone while the server runs open, without keys), anyone (`open`), clients on "
        "this machine (`loopback`; behind a proxy here, the forwarded client address counts), "
        "or nobody (`off`: 404).",
    )
    docs: Literal["open", "key", "off"] = Field(
        "open",
        description="The API's own description (/docs, /redoc, /openapi.json): served to "
        "anyone, to callers with an API key (`key`), or not at all.",
    )
    require_keys: bool = Field(
        False,
        description="Require API keys from the start. Without this they are required once one "
        "exists (rag-stream keys create) or on a non-loopback address; otherwise the server "
        'runs open, as the single tenant "local".',
    )


class KVSettings(BaseModel):
    """KV-cache snapshots in Redis (the vLLM connector in ``rag_stream.kv``, docs/kv.md)."""

    enabled: bool = Field(False, description="Save and load the engine's KV blocks through Redis.")
    redis_url: RedisUrl | None = Field(
        None,
        description="The Redis for KV blocks; unset: redis_url. The connector runs in the "
        "engine's process and the embedded Redis is only known once it starts, so enabling "
        "this needs one of the two.",
    )
    max_bytes: int = Field(
        2 << 30, ge=1 << 20, description="Cap on the stored KV bytes; the oldest go first."
    )
    ttl_s: int = Field(3600, ge=1, description="How long a stored KV block lives.")
    key_prefix: str = Field(
        "rag-stream:kv", min_length=1, description="Prefix of the KV blocks' Redis keys."
    )


class IngestSettings(BaseModel):
    """Knowledge-base ingestion: chunking, upload limits, embedding batches, the sample KB."""

    chunk_tokens: int = Field(
        200,
        ge=16,
        le=8192,
        description="Tokens per chunk, capped at what the embedder reads.",
    )
    chunk_overlap: int = Field(
        32, ge=0, description="Tokens a chunk repeats from the one before (at most half)."
    )
    max_upload_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="Largest document upload, in bytes."
    )
    max_text_chars: int = Field(
        2_000_000,
        ge=1,
        description="The most text a parsed upload may yield. Uploads are parsed in worker "
        "processes (ingest/sandbox.py) within this and the two bounds below: a small hostile "
        "file can inflate to megabytes of text, or keep a parser busy for minutes.",
    )
    parse_timeout_s: float = Field(
        20.0, gt=0, description="The longest one upload may take to parse."
    )
    parse_memory_mb: int = Field(
        1024,
        ge=256,
        description="A parse worker's address-space limit (not resident memory: a worker "
        "needs ~100 MB before it parses).",
    )
    parse_workers: int = Field(
        2, ge=1, description="Uploads parsed at once, each in a process kept warm."
    )
    embed_batch_size: int = Field(64, ge=1, description="Chunks embedded in one batch.")
    background_above_chars: int = Field(
        50_000,
        ge=0,
        description="An upload whose text is longer than this is ingested in the background: "
        "the request answers 202 with the document's id at once, and GET on the document shows "
        "its progress (docs/protocol.md). A shorter one is ingested inside its request (a few "
        "seconds at most), and nothing is stored if its client leaves first.",
    )
    max_active: int = Field(
        8,
        ge=1,
        description="Uploads one process ingests at once, in requests and in the background; "
        "one more is refused with 429 and Retry-After.",
    )
    max_active_per_tenant: int = Field(
        4,
        ge=1,
        description="Uploads one process ingests at once for one tenant; one more is refused "
        "with 429 and Retry-After.",
    )
    sample_kb: bool = Field(
        False,
        description='Ingest the project\'s docs/ into a knowledge base named "docs" when `serve` '
        "starts.",
    )
    sample_kb_vectors: bool = Field(
        True,
        description="Keep the sample KB's vectors in models_dir (sample-kb-vectors.npz), so that "
        "a start on a new data folder ingests it without embedding it again.",
    )

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

    backend: Literal["edge", "local"] = Field(
        "edge",
        description="`edge`: qdrant-edge, Qdrant's engine in-process, with real payload and "
        "vector indexes (data_dir/vectors). `local`: qdrant-client's local mode "
        "(data_dir/qdrant), which scans every point in Python, slow past a few thousand "
        "chunks; kept because it speaks the server's API, so that code path is tested without "
        "a server.",
    )
    optimize_after_points: int = Field(
        20_000,
        ge=0,
        description="Edge builds its indexes only when asked: after writes, once this many "
        "points are unindexed; 0: never then.",
    )
    optimize_idle_s: float = Field(
        30.0,
        ge=0,
        description="Edge also builds its indexes when writes have paused this long; 0: never "
        "then.",
    )


class Settings(BaseSettings):
    """Top-level settings: where the state lives, the services used, the model, the listener;
    then one group per concern."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    profile: str = Field("default", description="Which `configs/<profile>.yaml` to start from.")
    data_dir: Path = Field(
        Path(".data"),
        description="All embedded state: the SQLite file, the vector store, the Redis data, "
        "the prepared models.",
    )
    models_dir: Path | None = Field(
        None, description="Where prepared models are; unset: data_dir/models."
    )
    database_url: DatabaseUrl | None = Field(
        None,
        description="The database, e.g. postgresql+asyncpg://user@host:5432/db; unset: a SQLite "
        "file in data_dir.",
    )
    redis_url: RedisUrl | None = Field(
        None,
        description="The Redis of the event log, quotas and presence, e.g. "
        "redis://host:6379/0; unset: an embedded Redis in data_dir, for one process only.",
    )
    qdrant_url: str | None = Field(
        None,
        description="A Qdrant server, e.g. http://qdrant:6333; unset: the embedded store of "
        "vector_store.backend in data_dir, for one process only.",
    )
    engine_urls: Annotated[list[EngineUrl], NoDecode] = Field(
        [],
        description="vLLM OpenAI servers to generate on, as replicas (comma-separated base "
        "URLs); empty: the in-process engine. The model's files must be here too (its "
        "tokenizer and chat template).",
    )
    model: str | None = Field(
        None,
        description="A local model path or Hugging Face id vLLM can load; unset: the prepared "
        "SmolLM2-135M-Instruct in models_dir.",
    )
    served_model_name: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="The model's name in responses and in /v1/models; unset: the model folder's "
        "name (never the server's filesystem path), or the id as given for a hub id.",
    )
    embedder: str | None = Field(
        None,
        description="A sentence-transformers path or id; unset: the prepared all-MiniLM-L6-v2 "
        "in models_dir.",
    )
    embedder_backend: EmbedderBackend = Field(
        "auto",
        description="What runs the embedder: `onnx`, its transformer on ONNX Runtime from the "
        "export prepare-models writes next to the model (one query ~2.5x faster on CPU, the "
        "same vectors); `torch`, sentence-transformers; `auto`, onnx when the model allows it "
        "(mean pooling and an export), torch otherwise.",
    )
    dtype: Dtype = Field(
        "float32",
        description="The engine's dtype. float32 keeps crash takeover exact on CPU (a greedy "
        "continuation rebuilt from token ids matches the uninterrupted run); bfloat16 trades "
        "that for speed.",
    )
    host: str = Field("127.0.0.1", description="The address `serve` listens on.")
    port: int = Field(8000, ge=0, le=65535, description="The port `serve` listens on.")
    keep_alive_s: int = Field(
        75,
        ge=1,
        le=3600,
        description="Seconds an idle client connection stays open for its next request. Keep "
        "it longer than the idle timeout of the proxy or load balancer in front (60 s for "
        "most), or the proxy may send a request down a connection this server is closing: a "
        "502.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="The least severe log records written."
    )
    public_url: HttpUrl | None = Field(
        None,
        description="The service's address as clients see it (behind a proxy), for the URLs "
        "it hands out (citation links); unset: taken from each request.",
    )
    allow_embedded: bool = Field(
        True,
        description="Let embedded services stand in for unset URLs. False (the production "
        "profile): database_url, redis_url and qdrant_url must all be set.",
    )

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
        if self.kv.enabled and self.resolved_kv_redis_url is None:
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
        """The Redis of the KV connector: its own, else the service's (None: neither is set,
        which kv.enabled refuses)."""
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
            # a list item's index is no part of the variable's name (the message quotes it)
            path = [str(p) for p in err["loc"] if not isinstance(p, int)]
            if path:
                message = f"{ENV_PREFIX}{'__'.join(path).upper()}: {message}"
            parts.append(message)
        raise ConfigError("; ".join(parts)) from None
