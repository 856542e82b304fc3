"""The processes a test session shares or starts ahead of their turn: the tiny-model, stub,
SmolLM2 and default-profile servers, the multi-process set-ups of some modules, and the rule
that stops each after the last test of the run that uses it. A pytest plugin of the root
conftest (``pytest_plugins``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    POSTGRES_URL,
    REDIS_URL,
    SESSION_PREFIX,
    STUB_DELAY_S,
    ServerFactory,
)
from tests.support.cluster import Cluster
from tests.support.jobs_pair import JobsPair, start_jobs_pair
from tests.support.kv_engines import KvEngines, start_kv_engines, wanted_engines
from tests.support.lanes import LaneScheduling, check_lanes, this_lane
from tests.support.redis_keys import drop_keys
from tests.support.server import ROOT, ServerProcess

# Where the tiny server saves KV blocks (its connector's keys and counters).
TINY_KV_PREFIX = f"{SESSION_PREFIX}-kv"


def used_by_this_run(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test this process runs (its lane's, under xdist) uses ``fixture``."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in this_lane(request.node))


# A session's shared processes hold a few GB each (an engine ~3-4 GB with its core and worker)
# and the machine has 24: each stops once the last test of this run that uses it has run, not
# at the end of the session. Its fixture's own teardown still runs then (stopping is idempotent).
_RELEASES = pytest.StashKey[dict[str, Callable[[], object]]]()


def release_after_last_user(
    request: pytest.FixtureRequest, fixture: str, stop: Callable[[], object]
) -> None:
    """Call ``stop`` after the last test of this run whose fixtures include ``fixture``."""
    request.config.stash.setdefault(_RELEASES, {})[fixture] = stop


# The shared processes that run a vLLM engine: each is started by one lane only
ENGINE_FIXTURES = (
    "tiny_server_start",
    "default_server_start",
    "takeover_victim_start",
    "jobs_servers_start",
    "smollm2_server_start",
    "drafting_smollm2_start",
    "chat_page_server_start",
    "cluster_start",
    "kv_engines_start",
    "drafting_tiny_start",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    check_lanes(items, ENGINE_FIXTURES)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LaneScheduling:
    return LaneScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    releases = item.config.stash.get(_RELEASES, {})
    if not releases:
        return
    items = this_lane(item)
    later = items[items.index(item) + 1 :] if nextitem is not None else []
    for fixture in list(releases):
        if not any(fixture in getattr(later_item, "fixturenames", ()) for later_item in later):
            releases.pop(fixture)()


@pytest.fixture(scope="session")
def tiny_server_start(
    request: pytest.FixtureRequest, server_factory: ServerFactory, tiny_model: Path
) -> Iterator[ServerProcess]:
    """``tiny_server``, started but not waited for (``START_AHEAD``)."""
    server = server_factory(
        wait=False,
        RAG_STREAM_MODEL=str(tiny_model),
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_KV__ENABLED="true",
        RAG_STREAM_KV__KEY_PREFIX=TINY_KV_PREFIX,
    )

    def stop() -> None:
        server.stop()  # no more saves: then its blocks can go
        drop_keys(REDIS_URL, TINY_KV_PREFIX)

    release_after_last_user(request, "tiny_server_start", stop)
    yield server
    stop()


@pytest.fixture(scope="session")
def tiny_server(tiny_server_start: ServerProcess) -> ServerProcess:
    """One server on the tiny model and the real local Redis, shared by protocol tests.

    KV snapshots are on, so that the test of that wiring (test_kv_server.py) needs no engine
    start of its own (half a minute or more here). The connector changes no stream: this
    server only loads blocks it saved itself, and restored KV gives the tokens recomputed KV
    gives (test_kv_restore.py)."""
    tiny_server_start.wait_ready()
    return tiny_server_start


@pytest.fixture(scope="session")
def stub_server(request: pytest.FixtureRequest, server_factory: ServerFactory) -> ServerProcess:
    """The real service on the paced stub engine and the real local Redis: for protocol tests
    whose point is timing (a stream still running when the client leaves, say)."""
    server = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
    )
    release_after_last_user(request, "stub_server", server.stop)
    return server


@pytest.fixture(scope="session")
def default_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("default-data")


@pytest.fixture(scope="session")
def default_server_start(server_factory: ServerFactory, default_data_dir: Path) -> ServerProcess:
    """The default-profile server, started but not waited for; ``default_server`` has it.

    Started a few modules ahead of its own (``START_AHEAD``): a vLLM start is mostly one busy
    core at a time, and those modules mostly wait on stub servers, so it is ready, its sample
    KB ingested, when its module comes."""
    return server_factory(wait=False, RAG_STREAM_PROFILE="default", data_dir=default_data_dir)


@pytest.fixture(scope="module")
def default_server(default_server_start: ServerProcess) -> Iterator[ServerProcess]:
    """The default profile with no URLs: SmolLM2, embedded Redis, SQLite, local Qdrant."""
    default_server_start.wait_ready()
    yield default_server_start
    default_server_start.stop()  # engines hold ~3 GB each: free it for the next module


@pytest.fixture(scope="session")
def takeover_victim_start(
    request: pytest.FixtureRequest, server_factory: ServerFactory, smollm2_path: Path
) -> ServerProcess:
    """test_takeover.py's victim (SmolLM2, the real Redis), started, not waited for; the
    survivor is ``smollm2_server``. No other test's stream is taken over by either: a process
    continues only streams of its own model, and the session's other SmolLM2 servers on this
    Redis keep their streams under prefixes of their own (the jobs pair) or have stopped."""
    return _smollm2_on_redis(request, server_factory, smollm2_path, "takeover_victim_start")


@pytest.fixture(scope="session")
def jobs_servers_start(
    request: pytest.FixtureRequest,
    server_factory: ServerFactory,
    tmp_path_factory: pytest.TempPathFactory,
    models_dir: Path,
) -> Iterator[JobsPair]:
    """test_jobs.py's two servers (tests/support/jobs_pair.py), started, not waited for."""
    from tests.support.pg import postgres_database  # (it imports this module)

    dirs = (
        tmp_path_factory.mktemp("job-docs"),
        tmp_path_factory.mktemp("job-data"),
        tmp_path_factory.mktemp("job-data"),
    )
    databases = postgres_database("rag_stream_jobs")
    db = next(databases)
    pair = start_jobs_pair(server_factory, dirs, models_dir, REDIS_URL, SESSION_PREFIX, db)

    def close() -> None:
        pair.close()
        next(databases, None)  # the database goes after its servers

    release_after_last_user(request, "jobs_servers_start", close)
    yield pair
    close()


def _smollm2_on_redis(
    request: pytest.FixtureRequest,
    server_factory: ServerFactory,
    model: Path,
    fixture: str,
    **settings: str,
) -> ServerProcess:
    """The body of a session fixture named ``fixture``: a SmolLM2 server on the real Redis
    (test profile, and ``settings``), started, not waited for; stopped after the last test that
    uses it."""
    server = server_factory(
        wait=False, RAG_STREAM_MODEL=str(model), RAG_STREAM_REDIS_URL=REDIS_URL, **settings
    )
    release_after_last_user(request, fixture, server.stop)
    return server


@pytest.fixture(scope="session")
def smollm2_server_start(
    request: pytest.FixtureRequest, server_factory: ServerFactory, smollm2_path: Path
) -> ServerProcess:
    """``smollm2_server``, started but not waited for (``START_AHEAD``)."""
    return _smollm2_on_redis(request, server_factory, smollm2_path, "smollm2_server_start")


@pytest.fixture(scope="session")
def smollm2_server(smollm2_server_start: ServerProcess) -> ServerProcess:
    """A SmolLM2 server on the real Redis (test profile): the cluster's reference, and the
    peer that takes over from test_engine_death.py's and test_takeover.py's victims."""
    smollm2_server_start.wait_ready()
    return smollm2_server_start


@pytest.fixture(scope="session")
def drafting_smollm2_start(
    request: pytest.FixtureRequest, server_factory: ServerFactory, smollm2_path: Path
) -> ServerProcess:
    """SmolLM2 with prompt-lookup drafts on (``engine.speculative: ngram``, the product's
    default; the test profile's is off), on the real Redis, started, not waited for.
    test_drafts.py compares its greedy text with ``smollm2_server``'s; then test_engine_death.py,
    which comes after it, kills its engine core, and ``smollm2_server`` (no drafts) finishes the
    stream: one SmolLM2 start for both."""
    return _smollm2_on_redis(
        request,
        server_factory,
        smollm2_path,
        "drafting_smollm2_start",
        RAG_STREAM_ENGINE__SPECULATIVE="ngram",
    )


# Where the speculative tiny server saves KV blocks (its own, not the tiny server's)
SPECULATIVE_KV_PREFIX = f"{SESSION_PREFIX}-kv-spec"


@pytest.fixture(scope="session")
def drafting_tiny_start(
    request: pytest.FixtureRequest, server_factory: ServerFactory, tiny_model: Path
) -> Iterator[ServerProcess]:
    """The tiny model with prompt-lookup drafts and KV snapshots on (as ``tiny_server``, whose
    text test_drafts.py compares it with), on the real Redis, started, not waited for."""
    server = server_factory(
        wait=False,
        RAG_STREAM_MODEL=str(tiny_model),
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_ENGINE__SPECULATIVE="ngram",
        RAG_STREAM_KV__ENABLED="true",
        RAG_STREAM_KV__KEY_PREFIX=SPECULATIVE_KV_PREFIX,
    )

    def stop() -> None:
        server.stop()
        drop_keys(REDIS_URL, SPECULATIVE_KV_PREFIX)

    release_after_last_user(request, "drafting_tiny_start", stop)
    yield server
    stop()


@dataclass
class KeyedServer:
    """A server that requires API keys, on a PostgreSQL database of its own, and the settings
    its keys are made with (``rag-stream keys create`` in that environment)."""

    server: ServerProcess
    env: dict[str, str]

    def make_key(self, tenant: str = "local") -> str:
        """A key from the real CLI, on the server's database (tenant ``local`` owns the
        sample KB, so a page lists it beside a test's own)."""
        args = [sys.executable, "-m", "rag_stream", "keys", "create", "--tenant", tenant]
        env = {**os.environ, **self.env}
        out = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]


def _keyed_server(
    request: pytest.FixtureRequest,
    server_factory: ServerFactory,
    tmp_path_factory: pytest.TempPathFactory,
    fixture: str,
    database: str,
    stub_delay_s: float | None = None,
    **settings: str,
) -> Iterator[KeyedServer]:
    """The body of a session fixture named ``fixture``: a server requiring keys, on a fresh
    database named after ``database``, started, not waited for (``START_AHEAD``); it stops,
    then its database goes, after the last test of the run that uses it. With ``stub_delay_s``
    it runs the stub engine at that pace, else vLLM."""
    from tests.support.pg import postgres_database  # (it imports this module)

    databases = postgres_database(database)
    data = tmp_path_factory.mktemp(fixture)
    env = {
        "RAG_STREAM_PROFILE": "test",
        "RAG_STREAM_DATA_DIR": str(data),
        "RAG_STREAM_DATABASE_URL": next(databases),
        "RAG_STREAM_REDIS_URL": REDIS_URL,
        "RAG_STREAM_SECURITY__REQUIRE_KEYS": "true",
        **settings,
    }
    server = server_factory(wait=False, data_dir=data, stub_delay_s=stub_delay_s, **env)

    def stop() -> None:
        server.stop()
        next(databases, None)

    release_after_last_user(request, fixture, stop)
    yield KeyedServer(server, env)
    stop()


# test_tenants.py's server keeps its Redis keys under this prefix.
TENANTS_PREFIX = f"{SESSION_PREFIX}-tenants"


@pytest.fixture(scope="session")
def tenant_server_start(
    request: pytest.FixtureRequest,
    server_factory: ServerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KeyedServer]:
    """test_tenants.py's server: the paced stub engine (what it checks happens before and
    around generation; keys on vLLM are the chat page's server's), small limits."""
    yield from _keyed_server(
        request,
        server_factory,
        tmp_path_factory,
        "tenant_server_start",
        "rag_stream_tenants",
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_LIMITS__PER_TENANT_ACTIVE="2",
        RAG_STREAM_LIMITS__REQUESTS_PER_MINUTE="400",
        RAG_STREAM_LIMITS__MAX_ACTIVE_STREAMS="3",
        RAG_STREAM_LIMITS__MAX_QUEUED="1",
        # streams long enough to be running while a test does things around them
        RAG_STREAM_LIMITS__MAX_TOKENS="8000",
        RAG_STREAM_STREAMING__KEY_PREFIX=TENANTS_PREFIX,
    )


@pytest.fixture(scope="session")
def chat_page_server_start(
    request: pytest.FixtureRequest,
    server_factory: ServerFactory,
    smollm2_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KeyedServer]:
    """tests/e2e/test_chat_page.py's server: SmolLM2, the sample KB ingested as it starts."""
    yield from _keyed_server(
        request,
        server_factory,
        tmp_path_factory,
        "chat_page_server_start",
        "rag_stream_e2e",
        RAG_STREAM_MODEL=str(smollm2_path),
        RAG_STREAM_INGEST__SAMPLE_KB="true",  # docs/, ingested in the background
    )


@pytest.fixture(scope="session")
def cluster_start(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Iterator[Cluster]:
    """test_cluster.py's ``scripts/cluster.sh`` topology, launched, not waited for."""
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), smollm2_path, REDIS_URL, POSTGRES_URL)
    cluster.begin()
    yield cluster
    cluster.stop()  # (the module stops it first; this is for a run that never reached it)


@pytest.fixture(scope="session")
def kv_engines_start(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model: Path,
    other_tiny_model: Path,
) -> Iterator[KvEngines]:
    """test_kv_restore.py's redis-server and its first engines, started, not waited for."""
    order = wanted_engines(
        item.fixturenames
        for item in request.session.items
        if "kv_engines_start" in getattr(item, "fixturenames", ())
    )
    engines = start_kv_engines(tmp_path_factory.mktemp("kv"), tiny_model, other_tiny_model, order)
    release_after_last_user(request, "kv_engines_start", engines.close)
    yield engines
    engines.close()


# The first test of the module on the left starts a later module's processes (a minute or
# two ahead): an engine start is mostly one busy core while those tests mostly wait on servers,
# subprocesses and timers, and an idle engine costs only memory until its module comes. In two
# lanes (tests/support/lanes.py) a module starts only what a later module of its lane uses.
START_AHEAD = {
    "test_admission.py": "tiny_server_start",
    "test_answers.py": "smollm2_server_start",
    "test_chat_completions.py": "cluster_start",
    # (test_conversation_list and test_database_restart run in-process now, in seconds: the
    # default server, SmolLM2 and the sample KB, needs the modules before them too)
    "test_coalesce.py": "default_server_start",
    "test_default_stack.py": "drafting_smollm2_start",
    "test_detokenize_smollm2.py": "drafting_tiny_start",
    "test_job_redis_faults.py": "jobs_servers_start",
    "test_jobs.py": "kv_engines_start",
    "test_process_group.py": "takeover_victim_start",
    "test_takeover.py": "chat_page_server_start",  # tests/e2e runs last (``testpaths``)
}


@pytest.fixture(autouse=True)
def start_ahead(request: pytest.FixtureRequest) -> None:
    fixture = START_AHEAD.get(request.node.path.name)
    if fixture is not None and used_by_this_run(request, fixture):
        request.getfixturevalue(fixture)
