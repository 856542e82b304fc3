"""Chaos campaign (issue 17): break the running service in the ways production does and count,
for every stream that was running, whether its client got the uninterrupted text, a clear
error, or something silently wrong (the target: zero).

Topology: two API server processes (SmolLM2-135M float32, greedy, vLLM in-process, prefix
cache off so every run of a prompt computes alike) sharing a private redis-server
(append-only, fsync always) and a private PostgreSQL cluster; each has its own embedded vector
store holding the same knowledge base. Clients reconnect to any live server with
``Last-Event-ID``, as the bundled client does.

Scenarios:
- ``kill``: rounds of streams of every kind (generate, answers, chat completions, jobs), 2 of
  each on one server and 2 more on the other, kill -9 of the first at a random moment; the
  other takes its streams over and the killed one restarts. Victims alternate. 7 rounds: 56
  killed streams, 14 of each kind.
- ``engine-core``: kill -9 of one server's vLLM engine-core process alone.
- ``redis-persist`` / ``redis-empty``: kill -9 of redis-server under running streams, restarted
  1 s later from its append-only file, then without persistence (empty).
- ``postgres``: PostgreSQL restarted in immediate mode under running streams.
- ``slow-reader``: one reader taking 0.1 s per event next to four fast ones.
After each fault: the seconds until a new request succeeded on each server, and every /readyz
answer seen meanwhile.

    .venv/bin/python scripts/chaos.py --out docs/bench/chaos.json

About 30 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.chaos_parts import (  # noqa: E402
    Api,
    background,
    probe_recovery,
    run_cli,
)
from scripts.chaos_streams import (  # noqa: E402
    Followed,
    Spec,
    follow_in_thread,
    reference,
    start_and_follow,
    start_verdict,
    verdict,
)
from tests.support.own_pg import OwnPostgres  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

MODELS = ROOT / ".data" / "models"
KB = "chaos"
DOCS = {
    "lighthouses.md": "# Lighthouses\n\nThe Vell lighthouse uses a rotating Fresnel lens; its "
    "keeper winds the clockwork every four hours and logs passing ships in a red ledger.",
    "bakery.md": "# The night bakery\n\nDough rests for eighteen hours at eight degrees. The "
    "oven is fired with beech wood and reaches 280 degrees before the first loaves go in.",
    "glacier.md": "# Glacier survey\n\nStakes drilled into the ice show it moves 40 metres a "
    "year; meltwater channels are mapped each August with ground radar.",
    "canal.md": "# The canal locks\n\nEach of the twelve locks raises boats 3.5 metres; the "
    "lock keeper opens the paddles slowly so the chamber fills in six minutes.",
}
TOPICS = [
    "a lighthouse keeper", "a night baker", "a glacier surveyor", "a canal lock keeper",
    "a beekeeper", "a ferry captain", "a clockmaker", "an orchard farmer", "a miner",
    "a market trader", "a volcano watcher", "an astronomer", "a miller", "a forester",
]  # fmt: skip
QUESTIONS = [
    "How often is the lighthouse clockwork wound?", "How long does the bakery dough rest?",
    "How fast does the glacier move?", "How high does each canal lock raise a boat?",
    "What fuel heats the bakery oven?", "When are the glacier meltwater channels mapped?",
    "How long does a lock chamber take to fill?", "Where are passing ships recorded?",
]  # fmt: skip
MAX_TOKENS = 96


class Campaign:
    def __init__(
        self, folder: Path, seed: int, scale: int = 1, saved: Callable[[], None] = lambda: None
    ) -> None:
        """``scale``: the faults other than ``kill`` meet that many times their usual streams;
        ``saved`` writes the report so far (called after each kill round as well)."""
        self.folder = folder
        self.scale = scale
        self.saved = saved
        self.rng = random.Random(seed)
        self.counter = 0
        self.redis = RedisServer(folder / "redis")
        self.pg = OwnPostgres(folder / "pg")
        self.apis: list[Api] = []
        self.results: dict[str, Any] = {}

    # ---- set-up ----------------------------------------------------------------------

    def up(self) -> None:
        self.redis.start(persist=True)
        self.pg.start()
        (self.folder / "logs").mkdir()
        docs = self.folder / "docs"
        docs.mkdir()
        for name, text in DOCS.items():
            (docs / name).write_text(text)
        base = {"RAG_STREAM_PROFILE": "test", "RAG_STREAM_MODELS_DIR": str(MODELS),
                "RAG_STREAM_DATABASE_URL": self.pg.url}  # fmt: skip
        dirs = [self.folder / "data-a", self.folder / "data-b"]
        run_cli({**base, "RAG_STREAM_DATA_DIR": str(dirs[0])}, "ingest", str(docs), "--kb", KB)
        run_cli({**base, "RAG_STREAM_DATA_DIR": str(dirs[1])}, "reindex", "--no-progress")
        for name, data in zip("ab", dirs, strict=True):
            env = {
                **base,
                "RAG_STREAM_DATA_DIR": str(data),
                "RAG_STREAM_MODEL": str(MODELS / "SmolLM2-135M-Instruct"),
                "RAG_STREAM_REDIS_URL": self.redis.url,
                "RAG_STREAM_ENGINE__ENABLE_PREFIX_CACHING": "false",
            }
            self.apis.append(Api(name, env, self.folder / "logs"))
        for api in self.apis:
            api.start(wait=False)
        for api in self.apis:
            api.wait()

    def down(self) -> None:
        for api in self.apis:
            api.stop()
        if self.redis.proc is not None and self.redis.proc.poll() is None:
            self.redis.kill()
        self.pg.stop()

    def live(self) -> list[str]:
        return [api.url for api in self.apis if api.ready]

    # ---- streams ---------------------------------------------------------------------

    def spec(self, kind: str) -> Spec:
        self.counter += 1
        n = self.counter
        topic = TOPICS[n % len(TOPICS)]
        if kind == "generate":
            prompt = f"Write a short story (number {n}) about {topic} and a storm."
            return Spec(kind, {"prompt": prompt, "chat": True, "max_tokens": MAX_TOKENS})
        if kind == "answers":
            question = f"{QUESTIONS[n % len(QUESTIONS)]} (question {n})"
            return Spec(kind, {"kb": KB, "question": question, "max_tokens": MAX_TOKENS})
        if kind == "chat":
            content = f"Describe, in detail, one working day of {topic} (day {n})."
            return Spec(kind, {"model": "SmolLM2-135M-Instruct", "stream": True,
                               "messages": [{"role": "user", "content": content}],
                               "max_tokens": MAX_TOKENS, "temperature": 0})  # fmt: skip
        outline = [f"Who {topic} is", f"A day of {topic} (part {n})"]
        return Spec("job", {"kb": KB, "title": f"Notes {n} on {topic}", "outline": outline,
                            "section_tokens": 48})  # fmt: skip

    def references(self, specs: list[Spec]) -> list[str]:
        urls = self.live()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return list(
                pool.map(lambda ix: reference(ix[1], urls[ix[0] % len(urls)]), enumerate(specs))
            )

    def judge(self, runs: list[Followed], expected: list[str]) -> list[dict[str, Any]]:
        url = self.live()[0]
        rows = []
        for run, text in zip(runs, expected, strict=True):
            outcome, why = verdict(run, text, url)
            rows.append({"kind": run.spec.kind, "verdict": outcome, "why": why[:400],
                         "reconnects": run.reconnects, "reader_errors": run.reader_errors[:3],
                         "stream_id": run.stream_id, "job_id": run.job_id})  # fmt: skip
        return rows

    def follow(self, placed: list[tuple[Spec, Api]]) -> list[tuple[Any, Followed]]:
        return [follow_in_thread(spec, api.url, self.live) for spec, api in placed]

    # ---- scenarios -------------------------------------------------------------------

    def kill_rounds(self, rounds: int, per_kind: int) -> None:
        mix = ["generate", "answers", "chat", "job"] * per_kind
        plan = []
        for r in range(rounds):
            victim, survivor = self.apis[r % 2], self.apis[(r + 1) % 2]
            placed = [(self.spec(k), victim) for k in mix]
            placed += [(self.spec("generate"), survivor), (self.spec("chat"), survivor)]
            plan.append((victim, survivor, placed))
        print(f"kill: references for {sum(len(p[2]) for p in plan)} streams", flush=True)
        expected = self.references([spec for _, _, placed in plan for spec, _ in placed])
        rows: list[dict[str, Any]] = []
        recoveries = []
        for r, (victim, survivor, placed) in enumerate(plan):
            want = expected[: len(placed)]
            expected = expected[len(placed) :]
            threads = self.follow(placed)
            time.sleep(self.rng.uniform(1.5, 9.0))
            running = [not run.ended for _, run in threads]
            fault_at = time.monotonic()
            victim.kill()
            restart = background(lambda v=victim: v.start())
            recovery = probe_recovery([survivor, victim], fault_at)
            for thread, _ in threads:
                thread.join(900)
            restart.join(900)
            judged = self.judge([run for _, run in threads], want)
            for row, (_, api), was_running in zip(judged, placed, running, strict=True):
                row.update(round=r, on_victim=api is victim, running_at_kill=was_running)
            rows += judged
            recoveries.append(recovery.report())
            counts = collections.Counter(
                (x["kind"], x["verdict"]) for x in judged if x["on_victim"] and x["running_at_kill"]
            )
            print(f"kill round {r} ({victim.name}): {dict(counts)}", flush=True)
            self.results["kill"] = {"streams": rows, "recovery": recoveries}
            self.saved()  # a campaign cut short keeps the rounds it ran

    def fault_round(
        self, name: str, fault: Any, heal: Any, kinds: list[str], on: list[Api] | None = None
    ) -> None:
        specs = [self.spec(k) for k in kinds]
        expected = self.references(specs)
        where = on or self.apis
        placed = [(spec, where[i % len(where)]) for i, spec in enumerate(specs)]
        threads = self.follow(placed)
        time.sleep(self.rng.uniform(2.0, 5.0))
        running = [not run.ended for _, run in threads]
        fault_at = time.monotonic()
        fault()
        healer = background(heal)
        recovery = probe_recovery(self.apis, fault_at)
        healer.join(900)
        for thread, _ in threads:
            thread.join(900)
        for api in self.apis:  # a fault may have left a server dead or unready
            if api.server is not None and api.server.proc.poll() is not None:
                api.start()
        judged = self.judge([run for _, run in threads], expected)
        for row, was_running in zip(judged, running, strict=True):
            row["running_at_kill"] = was_running
        counts = collections.Counter((x["kind"], x["verdict"]) for x in judged)
        print(f"{name}: {dict(counts)}", flush=True)
        self.results[name] = {"streams": judged, "recovery": recovery.report()}

    def child_killed(self, name: str, title: str) -> None:
        """kill -9 of one child process of server a: its engine core or its store worker."""
        api = self.apis[0]

        def fault() -> None:
            os.kill(api.child_pid(title), signal.SIGKILL)

        def heal() -> None:
            # an engine core does not come back; if the process is still up without one after
            # 60 s, restart it as a supervisor would
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and api.server is not None:
                if api.server.proc.poll() is not None:
                    break
                time.sleep(0.5)
            if api.server is not None and api.server.proc.poll() is None and title == "EngineCore":
                api.kill()
            if api.server is None or api.server.proc.poll() is not None:
                api.start()

        mix = ["generate", "answers", "chat", "answers", "generate", "chat", "answers", "job"]
        mix *= self.scale
        # every stream on server a, so the fault meets all of them
        self.fault_round(name, fault, heal, mix, on=[api])

    def redis_restart(self, persist: bool) -> None:
        def fault() -> None:
            self.redis.kill()

        def heal() -> None:
            time.sleep(1.0)
            if not persist:
                self.redis.wipe()
            self.redis.start(persist=persist)

        mix = ["generate", "answers", "chat", "job", "generate", "chat"] * self.scale
        if not persist:  # switch the running Redis to no persistence first
            self.redis.kill()
            self.redis.wipe()
            self.redis.start(persist=False)
            probe_recovery(self.apis, time.monotonic())  # both serve again
        self.fault_round("redis-persist" if persist else "redis-empty", fault, heal, mix)

    def postgres_restart(self) -> None:
        mix = ["generate", "answers", "chat", "job", "answers", "chat"] * self.scale
        self.fault_round("postgres", self.pg.restart, lambda: None, mix)

    def slow_reader(self) -> None:
        """One stream, four readers at full speed and one pausing 0.1 s after each event
        (slower than the engine writes): the fast ones must not wait for it, and it must still
        get every event."""
        api = self.apis[0]
        spec = Spec("generate", {"prompt": "Write a long story about a night train crossing "
                                 "the mountains.", "chat": True, "max_tokens": 300})  # fmt: skip
        expected = reference(spec, api.url)
        began = time.monotonic()
        alone = start_and_follow(spec, api.url, self.live)
        alone_s = alone.ended_at - began
        began = time.monotonic()
        owner_thread, owner = follow_in_thread(spec, api.url, self.live)
        while not owner.stream_id and time.monotonic() - began < 60:
            time.sleep(0.01)
        readers = [
            follow_in_thread(spec, api.url, self.live,
                             Followed(spec, api.url, stream_id=owner.stream_id, pause_s=pause))
            for pause in (0, 0, 0, 0.1)
        ]  # fmt: skip
        for thread, _ in [(owner_thread, owner), *readers]:
            thread.join(900)
        runs = [owner] + [run for _, run in readers]
        judged = self.judge([alone, *runs], [expected] * (len(runs) + 1))
        self.results["slow-reader"] = {
            "alone_s": round(alone_s, 2),
            "fast_readers_s": [round(r.ended_at - began, 2) for r in runs[:4]],
            "slow_reader_s": round(runs[-1].ended_at - began, 2),
            "events": len(owner.frames),
            "streams": judged,
        }
        shown = {k: v for k, v in self.results["slow-reader"].items() if k != "streams"}
        print(f"slow-reader: {shown}", flush=True)


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, section in results.items():
        rows = section["streams"]
        hit = [x for x in rows if x.get("running_at_kill", True) and x.get("on_victim", True)]
        by_kind: dict[str, collections.Counter[str]] = {}
        for row in hit:
            by_kind.setdefault(row["kind"], collections.Counter())[row["verdict"]] += 1
        out[name] = {k: dict(v) for k, v in by_kind.items()}
        out[name]["wrong"] = [x for x in rows if x["verdict"] == "wrong"]
    return out


def rejudge(path: Path) -> None:
    """Reports written before start_verdict called every start that named no stream
    ``wrong``; the rows keep what the client saw (its start's error), so they are judged again
    here without running anything."""
    report = json.loads(path.read_text())
    for section in report["results"].values():
        for row in section["streams"]:
            if not row["stream_id"] and not row["job_id"]:
                row["verdict"], row["why"] = start_verdict(row["reader_errors"])
    report["summary"] = summarise(report["results"])
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(report["summary"], indent=2, ensure_ascii=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-kind", type=int, default=2, help="streams of each kind a round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--scale", type=int, default=1, help="the other faults meet this many times their streams"
    )
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--rejudge",
        type=Path,
        help="no campaign: judge the starts that named no stream of this report again "
        "(start_verdict), and rewrite its summary",
    )
    args = parser.parse_args()
    if args.rejudge:
        rejudge(args.rejudge)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop what it started (finally)
    began = time.monotonic()

    def save(results: dict[str, Any]) -> None:
        """The report so far (after every scenario: a campaign cut short keeps its figures)."""
        report = {
            "command": " ".join(sys.argv),
            "seconds": round(time.monotonic() - began),
            "summary": summarise(results),
            "results": results,
        }
        if args.out:
            args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        print(json.dumps(report["summary"], indent=2, ensure_ascii=False), flush=True)

    with tempfile.TemporaryDirectory(prefix="rs-chaos-") as tmp:
        folder = Path(tmp)
        shutil.chown(folder, "postgres", "postgres")
        campaign = Campaign(folder, args.seed, args.scale, lambda: save(campaign.results))
        every = ["kill", "engine-core", "store-worker", "postgres", "slow-reader", "redis"]
        steps = {
            "kill": lambda: campaign.kill_rounds(args.rounds, args.per_kind),
            "engine-core": lambda: campaign.child_killed("engine-core", "EngineCore"),
            "store-worker": lambda: campaign.child_killed("store-worker", "edge_worker"),
            "postgres": campaign.postgres_restart,
            "slow-reader": campaign.slow_reader,
            "redis": lambda: (campaign.redis_restart(True), campaign.redis_restart(False)),
        }
        try:
            campaign.up()
            for name in every:
                if name in (args.only or every):
                    steps[name]()
                    save(campaign.results)
        finally:
            campaign.down()
            if (folder / "logs").exists():  # the servers' logs outlive the campaign
                kept = Path(tempfile.gettempdir()) / f"{folder.name}-logs"
                shutil.copytree(folder / "logs", kept)
                print(f"server logs: {kept}", flush=True)


if __name__ == "__main__":
    main()
