"""What server processes hold, seen from outside: memory, file descriptors, Redis keys and
connections, SQL rows. Used by the soak (scripts/soak.py), the reader benchmark
(scripts/bench_readers.py) and the short soak in CI (tests/integration/test_soak_short.py).

Redis connections are attributed by address, not by client name: every TCP connection a server
process (or one of its children) has open to the Redis port is counted, and matched against
``CLIENT LIST``, so a connection opened without a name (a client made per request, say) counts
too. The machine's Redis is shared, so nothing else on it is counted.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

import psutil
import redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from rag_stream.store.models import Base, StreamRecord


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its living descendants (the engine core, parse workers...)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass(frozen=True)
class ProcessSample:
    rss_mb: float  # the whole tree
    fds: int  # the whole tree
    threads: int
    children: int
    main_rss_mb: float  # the server process alone
    main_fds: int
    # the server process's anonymous memory (RSS less its file-backed and shared pages): what
    # it allocated. Under memory pressure the kernel drops file-backed pages (mapped libraries)
    # and RSS falls with them; this does not (no swap here).
    main_anon_mb: float
    # the children's RSS by role (``edge_worker``, ``parse_worker``, ``EngineCore``...), summed
    # when several share one (parse workers)
    children_rss_mb: dict[str, float] = field(default_factory=dict)
    children_by_role: dict[str, int] = field(default_factory=dict)  # how many of each


def sample_process(pid: int) -> ProcessSample:
    rss = fds = threads = 0
    main_rss = main_fds = main_anon = 0
    by_role: Counter[str] = Counter()
    count: Counter[str] = Counter()
    procs = process_tree(pid)
    for proc in procs:
        try:
            with proc.oneshot():
                memory = proc.memory_info()
                r, n, t = memory.rss, proc.num_fds(), proc.num_threads()
                role = "" if proc.pid == pid else _role(proc)
        except psutil.NoSuchProcess:
            continue  # a parse worker that just ended
        rss, fds, threads = rss + r, fds + n, threads + t
        if proc.pid == pid:
            main_rss, main_fds, main_anon = r, n, r - memory.shared
        else:
            by_role[role] += r
            count[role] += 1
    return ProcessSample(
        rss_mb=round(rss / 2**20, 1),
        fds=fds,
        threads=threads,
        children=max(0, len(procs) - 1),
        main_rss_mb=round(main_rss / 2**20, 1),
        main_fds=main_fds,
        main_anon_mb=round(main_anon / 2**20, 1),
        children_rss_mb={k: round(v / 2**20, 1) for k, v in sorted(by_role.items())},
        children_by_role=dict(sorted(count.items())),
    )


def _role(proc: psutil.Process) -> str:
    """A child's role: the module it runs (``python -m rag_stream.ingest.parse_worker``: its
    last part), else its process name (vLLM's ``EngineCore`` sets its title)."""
    argv = proc.cmdline()
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
    return proc.name()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process tree so far (children that ended are not counted)."""
    total = 0.0
    for proc in process_tree(pid):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _local_ports(pid: int, redis_port: int) -> set[int]:
    """Local ports of the tree's TCP connections to ``redis_port``."""
    ports: set[int] = set()
    for proc in process_tree(pid):
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            if c.raddr and c.raddr.port == redis_port and c.status == psutil.CONN_ESTABLISHED:
                ports.add(c.laddr.port)
    return ports


@dataclass(frozen=True)
class RedisConnections:
    sockets: int  # established TCP connections of the tree to Redis
    clients: int  # of those, the ones Redis lists as clients (CLIENT LIST)
    names: dict[str, int]  # client names of those, counted (pool vs presence)


class RedisProbe:
    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.port = urlparse(url).port or 6379
        self._r = redis.Redis.from_url(url, decode_responses=True)

    def close(self) -> None:
        self._r.close()

    def keys(self) -> list[str]:
        return list(self._r.scan_iter(f"{self.prefix}:*", count=1000))

    def key_census(self) -> dict[str, int]:
        """Keys under the prefix, counted by their shape (``s:*:log``, ``proc:*``...)."""
        return dict(Counter(key_shape(k, self.prefix) for k in self.keys()))

    def keys_without_ttl(self) -> list[str]:
        """Keys under the prefix that never expire. Every key this service writes has a TTL (a
        running stream's 24 h, a finished one's retention, a tenant's places...) except the
        list of running streams, which Redis deletes once it is empty; any other is a leak."""
        active = f"{self.prefix}:active"
        return [k for k in self.keys() if k != active and self._r.ttl(k) == -1]

    def connections(self, pids: list[int]) -> RedisConnections:
        ports: set[int] = set()
        for pid in pids:
            ports |= _local_ports(pid, self.port)
        listed = self._r.client_list()
        mine = [c for c in listed if int(c["addr"].rsplit(":", 1)[1]) in ports]
        names = Counter(_name_shape(c.get("name", "")) for c in mine)
        return RedisConnections(sockets=len(ports), clients=len(mine), names=dict(names))

    def running(self) -> int:
        """Streams the log lists as running (its sweepers' work list)."""
        return int(self._r.zcard(f"{self.prefix}:active"))

    def log(self, stream_id: str) -> list[str]:
        """The event JSON of every entry of a stream's log, in order (the producer's record)."""
        entries = self._r.xrange(f"{self.prefix}:s:{stream_id}:log")
        return [fields["e"] for _entry, fields in entries]

    def delete_all(self) -> None:
        """Remove every key under the prefix (after a run: the prefix was the run's own)."""
        for key in self.keys():
            self._r.delete(key)


def key_shape(key: str, prefix: str) -> str:
    parts = key.removeprefix(prefix + ":").split(":")
    if parts[0] == "s" and len(parts) >= 3:
        return f"s:*:{parts[-1]}"
    return f"{parts[0]}:*" if len(parts) > 1 else parts[0]


def _name_shape(name: str) -> str:
    # pool connections are named rag-stream:HOST:PID, the presence one HOST:PID:UUID
    if not name:
        return "(unnamed)"
    return "pool" if name.startswith("rag-stream:") else "presence"


async def sql_rows(url: str) -> dict[str, int]:
    """Rows in each of the service's tables."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            out = {}
            for table in Base.metadata.sorted_tables:
                count = await conn.execute(select(func.count()).select_from(table))
                out[table.name] = int(count.scalar_one())
            return out
    finally:
        await engine.dispose()


async def streams_missing(url: str, stream_ids: list[str]) -> list[str]:
    """Those of ``stream_ids`` with no row in the streams table."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            found: set[str] = set()
            for at in range(0, len(stream_ids), 1000):
                batch = stream_ids[at : at + 1000]
                rows = await conn.execute(select(StreamRecord.id).where(StreamRecord.id.in_(batch)))
                found.update(rows.scalars())
            return [sid for sid in stream_ids if sid not in found]
    finally:
        await engine.dispose()


def tcp_to(pid: int, port: int) -> int:
    """Established TCP connections of the process tree to ``port`` (its database pool, say)."""
    n = 0
    for proc in process_tree(pid):
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        n += sum(
            1
            for c in conns
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        )
    return n


@dataclass
class Probe:
    """Everything sampled at once, for a set of named server processes."""

    pids: dict[str, int]
    redis: RedisProbe
    database_url: str
    db_port: int | None = None  # a database server's port (its sockets are counted apart)
    started: float = field(default_factory=time.monotonic)

    async def snapshot(self, rows: bool = True, ttl_check: bool = False) -> dict[str, Any]:
        """Per process: memory, fds (and the fds that are not Redis or database sockets),
        Redis connections; the Redis keys under the prefix by shape; SQL rows per table."""
        out: dict[str, Any] = {"t_s": round(time.monotonic() - self.started, 1)}
        procs: dict[str, Any] = {}
        for name, pid in self.pids.items():
            sample, conns, db = await asyncio.to_thread(self._process, pid)
            procs[name] = {
                **asdict(sample),
                "redis_sockets": conns.sockets,
                "redis_clients": conns.clients,
                "redis_names": conns.names,
                "db_sockets": db,
                "other_fds": sample.fds - conns.sockets - db,
            }
        out["processes"] = procs
        census = await asyncio.to_thread(self.redis.key_census)
        out["redis_keys"] = sum(census.values())
        out["redis_key_shapes"] = census
        out["running_streams"] = await asyncio.to_thread(self.redis.running)
        if ttl_check:
            out["keys_without_ttl"] = await asyncio.to_thread(self.redis.keys_without_ttl)
        if rows:
            out["sql_rows"] = await sql_rows(self.database_url)
        return out

    def _process(self, pid: int) -> tuple[ProcessSample, RedisConnections, int]:
        sample = sample_process(pid)
        conns = self.redis.connections([pid])
        db = tcp_to(pid, self.db_port) if self.db_port else 0
        return sample, conns, db


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute (None for fewer than 3)."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return sxy / sxx * 60
