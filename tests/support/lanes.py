"""The suite's two lanes: `make test` runs them side by side, one pytest-xdist worker each
(``-n 2``), because one lane alone leaves a core idle about a third of the time (a vLLM start
keeps one core busy; a test waiting on a stream, a timer or a subprocess, none).

- ``engines``: the modules that share the session's vLLM servers and multi-process set-ups
  (tests/support/session_servers.py), so that each shared process starts ahead of its module
  and stops after its last user, as in a serial run; and one module without an engine, the
  ingest service's, which evens the two lanes' times.
- ``service``: everything else: unit tests, the in-process app (tests/support/inprocess.py),
  stub-engine servers, the CLIs, fuzzing.

``LaneScheduling`` hands each worker one whole lane, in collection order, and a worker knows
which tests are its own (``this_lane``). A shared vLLM process belongs to one lane:
``check_lanes`` fails the run when an edit makes a module of the other lane use one (it would
start twice). Without xdist (a module run alone) the lanes run one after the other.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from xdist.scheduler import LoadScopeScheduling

# modules whose tests start or share a vLLM engine (and one that evens the lanes); any other is
# in the service lane
ENGINE_MODULES = frozenset(
    {
        "test_answers.py",
        "test_ask_cli.py",
        "test_chat_completions.py",
        "test_client.py",
        "test_client_jobs.py",
        "test_cluster.py",
        "test_coalesce.py",
        "test_default_stack.py",
        "test_detokenize_smollm2.py",
        "test_engine_death.py",
        "test_drafts.py",
        "test_generate_stream.py",
        "test_input_bounds.py",
        "test_job_redis_faults.py",
        "test_jobs.py",
        "test_jobs_restart.py",
        "test_kv_restore.py",
        "test_kv_server.py",
        "test_process_group.py",
        "test_ingest_service.py",  # no engine: it evens the lanes
        "test_resume.py",
        "test_takeover.py",
        "test_chat_page.py",
        "test_chat_stop_engine.py",
        "test_ai_sdk.py",
        "test_page_files.py",
    }
)
LANES = ("engines", "service")


def lane_of_module(name: str) -> str:
    return "engines" if name in ENGINE_MODULES else "service"


def lane_of(item: pytest.Item) -> str:
    return lane_of_module(item.path.name)


def under_xdist(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


_BY_LANE = pytest.StashKey[dict[str, list[pytest.Item]]]()


def this_lane(item: pytest.Item) -> list[pytest.Item]:
    """The tests the process running ``item`` runs: its lane's under xdist, all otherwise."""
    items = item.session.items
    if not under_xdist(item.config):
        return items
    by_lane = item.config.stash.get(_BY_LANE, None)
    if by_lane is None:
        by_lane = {lane: [i for i in items if lane_of(i) == lane] for lane in LANES}
        item.config.stash[_BY_LANE] = by_lane
    return by_lane[lane_of(item)]


class LaneScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, a lane being the scope: with two workers, each runs one
    lane whole (pytest 9's node ids no longer carry xdist's ``loadgroup`` marks)."""

    def _split_scope(self, nodeid: str) -> str:
        return lane_of_module(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])


def check_lanes(items: Iterable[pytest.Item], shared: Iterable[str]) -> None:
    """Fail when a shared process (a session fixture of session_servers.py) is used by both
    lanes: under xdist each lane's worker would start one of its own, two engines where the
    machine has room for one."""
    by_fixture: dict[str, set[str]] = {}
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            by_fixture.setdefault(fixture, set()).add(lane_of(item))
    both = sorted(f for f in shared if len(by_fixture.get(f, ())) > 1)
    if both:
        raise pytest.UsageError(
            f"used by both test lanes: {', '.join(both)}; move the modules that use them into "
            "one lane (tests/support/lanes.py)"
        )
