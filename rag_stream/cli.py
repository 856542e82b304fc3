"""The ``rag-stream`` command. Thin: parses arguments and calls into the packages."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from rag_stream.ask_cli import add_ask_command
from rag_stream.errors import (
    ConfigError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from rag_stream.job_cli import add_job_commands
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import ENV_PREFIX, Settings, load_settings, without_password


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        profile=getattr(args, "profile", None),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
    )


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How `serve` runs uvicorn, one process or several."""
    from rag_stream.api.access_log import log_config
    from rag_stream.api.http_protocol import bounded_head_protocol

    return {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": log_config(),  # uvicorn's, with query values left out of the access log
        "timeout_graceful_shutdown": 5,
        "timeout_keep_alive": settings.keep_alive_s,
        "loop": "uvloop",
        # httptools, with a time limit on each request's line and headers
        "http": bounded_head_protocol(settings.limits.header_timeout_s),
    }


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rag_stream.app import create_app
    from rag_stream.preflight import preflight

    settings = _settings(args)
    workers = args.workers
    if workers > 1 and settings.process_local_parts:
        raise ConfigError(
            f"--workers {workers} needs parts every process can share, but this configuration "
            f"has {', '.join(settings.process_local_parts)}"
        )
    _logging(settings.log_level)
    log = logging.getLogger("rag_stream")
    log.info("serve: checking settings and applying migrations (profile %s)", settings.profile)
    preflight(settings)
    log.info(
        "serve: starting %d process(es) on http://%s:%d", workers, settings.host, settings.port
    )
    common = uvicorn_options(settings)
    if workers == 1:
        app = create_app(settings)
        server = uvicorn.Server(uvicorn.Config(app, **common))
        app.state.request_exit = lambda: setattr(server, "should_exit", True)
        server.run()
        if not server.started:
            return 3  # its start-up failed (what uvicorn.run exits with then)
        return int(app.state.exit_status)  # 1 when its engine failed to start or died
    # Each worker process builds its own app from the same settings, passed by environment.
    os.environ[f"{ENV_PREFIX}PROFILE"] = settings.profile
    os.environ[f"{ENV_PREFIX}HOST"] = settings.host
    os.environ[f"{ENV_PREFIX}PORT"] = str(settings.port)
    uvicorn.run("rag_stream.app:app_from_environment", factory=True, workers=workers, **common)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from rag_stream.preflight import migrate

    settings = _settings(args)
    _logging(settings.log_level)
    migrate(settings)
    url = settings.resolved_database_url
    print(f"database at head: {without_password(url, url)}")
    return 0


def cmd_prepare_models(args: argparse.Namespace) -> int:
    from rag_stream.prepare import prepare_models

    settings = _settings(args)
    _logging("info")
    prepare_models(settings, force=args.force, verify=not args.no_verify)
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from rag_stream.ingest.local import ingest_paths
    from rag_stream.preflight import migrate

    settings = _settings(args)
    _logging("warning")
    migrate(settings)
    paths = [Path(p) for p in args.paths]
    try:
        summary, others = asyncio.run(
            ingest_paths(
                settings, args.kb, paths, progress=not args.no_progress, tenant=args.tenant
            )
        )
    except (InvalidRequest, ServiceUnavailable) as exc:
        print(f"rag-stream ingest: {exc.message}", file=sys.stderr)
        return 1
    for path, problem in summary.failed:
        print(f"skipped {path}: {problem}", file=sys.stderr)
    if others:
        print(f"left out {len(others)} file(s) of unsupported types", file=sys.stderr)
    rate = summary.chunks / summary.seconds if summary.seconds else 0.0
    print(
        f"kb {args.kb}: {summary.documents} documents ({summary.created} new, "
        f"{summary.replaced} replaced, {summary.unchanged} unchanged, "
        f"{len(summary.failed)} failed), {summary.chunks} chunks, "
        f"{summary.seconds:.1f} s ({rate:.0f} chunks/s)"
    )
    return 1 if summary.failed and not summary.documents else 0


def cmd_search(args: argparse.Namespace) -> int:
    import asyncio

    from rag_stream.ingest.local import search_kb

    settings = _settings(args)
    _logging("warning")
    try:
        hits = asyncio.run(
            search_kb(settings, args.kb, args.query, args.top_k, args.mmr, args.tenant)
        )
    except (NotFound, ServiceUnavailable) as exc:
        print(f"rag-stream search: {exc.message}", file=sys.stderr)
        return 1
    if not hits:
        print("no results")
    for rank, hit in enumerate(hits, start=1):
        where = f" › {hit.heading}" if hit.heading else ""
        print(
            f"{rank}. [{hit.score:.3f}] {hit.title}{where}  (doc {hit.document_id}, "
            f"chars {hit.start}-{hit.end})"
        )
        print("   " + " ".join(hit.text.split())[:300])
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    import asyncio

    from rag_stream.ingest.local import reindex_store
    from rag_stream.preflight import migrate
    from rag_stream.store.db import unavailable

    settings = _settings(args)
    _logging("warning")
    migrate(settings)
    try:
        summary = asyncio.run(
            reindex_store(settings, re_embed=args.re_embed, progress=not args.no_progress)
        )
    except ServiceUnavailable as exc:
        print(f"rag-stream reindex: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:
        # the database lost after the migration (PostgreSQL restarting once initialised, say):
        # one line, as when the migration itself cannot reach it
        lost = unavailable(exc)
        if lost is None:
            raise
        said = without_password(str(exc), settings.database_url).strip().splitlines()
        print(f"rag-stream reindex: {lost.message}: {said[0] if said else ''}", file=sys.stderr)
        return 1
    print(
        f"reindexed {summary.chunks} chunks ({summary.copied} dense vectors copied from the old "
        f"store, {summary.embedded} embedded)"
    )
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    import asyncio

    from rag_stream.preflight import migrate
    from rag_stream.store import keys
    from rag_stream.store.db import create_db

    settings = _settings(args)
    _logging("warning")
    migrate(settings)

    async def run() -> int:
        db_engine, sessions = create_db(settings.resolved_database_url)
        try:
            async with sessions() as session:
                if args.keys_command == "create":
                    made = await keys.create_key(session, args.tenant, args.name)
                    print(f"API key {made.id} for tenant {made.tenant!r} (shown only now):")
                    print(made.key)
                elif args.keys_command == "revoke":
                    gone = await keys.revoke_key(session, args.id)
                    print(f"revoked {gone.id} (tenant {gone.tenant!r})")
                else:
                    for k in await keys.list_keys(session):
                        state = f"revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "live"
                        label = k.name or "-"
                        print(f"{k.id}  {k.prefix}…  tenant={k.tenant}  name={label}  {state}")
        except NotFound as exc:
            print(f"rag-stream keys: {exc.message}", file=sys.stderr)
            return 1
        finally:
            await db_engine.dispose()
        return 0

    return asyncio.run(run())


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


def _tenant_name(value: str) -> str:
    from pydantic import TypeAdapter, ValidationError

    from rag_stream.schemas.tenants import TenantName

    try:
        return TypeAdapter(TenantName).validate_python(value)
    except ValidationError:
        raise argparse.ArgumentTypeError(
            "a tenant is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        ) from None


def _key_label(value: str) -> str:
    if not 1 <= len(value) <= 128:
        raise argparse.ArgumentTypeError("a key's name is 1-128 characters")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rag-stream", description=__doc__)
    parser.add_argument("--profile", help="configs/<profile>.yaml (env RAG_STREAM_PROFILE)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API (embedded defaults unless URLs are set)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="API processes (more than 1 needs engine, Redis and Qdrant URLs: nothing embedded)",
    )
    serve.set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="apply Alembic migrations").set_defaults(func=cmd_db_upgrade)

    local_note = (
        "Runs in-process on the configured stores. The embedded vector store locks its folder, "
        "so stop a `rag-stream serve` that uses the same data dir first (or set "
        "RAG_STREAM_QDRANT_URL to a Qdrant server both share)."
    )
    tenant_help = "the tenant whose knowledge base it is (default: local, the open mode's)"
    ingest = sub.add_parser(
        "ingest",
        help="ingest files and folders (recursively) into a knowledge base",
        description="Ingest .txt, .md, .html and .pdf files into a knowledge base (created if "
        "missing); re-ingesting a changed file replaces it. " + local_note,
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    ingest.add_argument("--kb", required=True, help="knowledge base name")
    ingest.add_argument("--no-progress", action="store_true", help="no progress bar")
    ingest.add_argument("--tenant", default=LOCAL_TENANT, help=tenant_help)
    ingest.set_defaults(func=cmd_ingest)

    search = sub.add_parser(
        "search",
        help="search a knowledge base",
        description="Search a knowledge base. " + local_note,
    )
    search.add_argument("query")
    search.add_argument("--kb", required=True, help="knowledge base name or id")
    search.add_argument("--top-k", type=int, default=5)
    search.add_argument("--mmr", action="store_true", help="diversify the results")
    search.add_argument("--tenant", default=LOCAL_TENANT, help=tenant_help)
    search.set_defaults(func=cmd_search)

    reindex = sub.add_parser(
        "reindex",
        help="rebuild the vector store from the database (after an upgrade or a new embedder)",
        description="Rebuild the vector store from the chunks in the database: dense vectors "
        "are copied from a store made before hybrid search when it has them, else embedded; "
        "BM25 vectors are computed from the text. Then the old store is removed. " + local_note,
    )
    reindex.add_argument(
        "--re-embed", action="store_true", help="embed every chunk again (a new embedder)"
    )
    reindex.add_argument("--no-progress", action="store_true", help="no progress bar")
    reindex.set_defaults(func=cmd_reindex)

    keys = sub.add_parser(
        "keys",
        help="API keys: create, list, revoke",
        description="API keys are stored as hashes; a key is shown once, when created. Once "
        "any key exists, the server requires one on every request.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key for a tenant (printed once)")
    create.add_argument("--tenant", required=True, type=_tenant_name)
    create.add_argument("--name", type=_key_label, help="a label to recognise the key by")
    keys_sub.add_parser("list", help="every key: id, prefix, tenant, label, state")
    revoke = keys_sub.add_parser("revoke", help="revoke a key at once (it gets 401 from then)")
    revoke.add_argument("id", help="the key's id (from keys list)")
    keys.set_defaults(func=cmd_keys)

    prep = sub.add_parser("prepare-models", help="prepare the default LLM and embedder once")
    prep.add_argument("--force", action="store_true", help="rebuild even if prepared")
    prep.add_argument("--no-verify", action="store_true", help="skip the generation check")
    prep.set_defaults(func=cmd_prepare_models)

    add_ask_command(sub)  # a client of a running server (rag_stream/ask_cli.py)
    add_job_commands(sub)  # long-document jobs on a running server (rag_stream/job_cli.py)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"rag-stream: configuration error: {exc.message}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
