"""The ``rag-stream`` command. Thin: parses arguments and calls into the packages."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rag_stream.errors import (
    ConfigError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from rag_stream.settings import Settings, load_settings


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


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rag_stream.app import create_app
    from rag_stream.preflight import preflight

    settings = _settings(args)
    _logging(settings.log_level)
    log = logging.getLogger("rag_stream")
    log.info("serve: checking settings and applying migrations (profile %s)", settings.profile)
    preflight(settings)
    log.info("serve: starting on http://%s:%d", settings.host, settings.port)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
        loop="uvloop",
        http="httptools",
    )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from rag_stream.preflight import migrate

    settings = _settings(args)
    _logging(settings.log_level)
    migrate(settings)
    print(f"database at head: {settings.resolved_database_url}")
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
            ingest_paths(settings, args.kb, paths, progress=not args.no_progress)
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
        hits = asyncio.run(search_kb(settings, args.kb, args.query, args.top_k, args.mmr))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rag-stream", description=__doc__)
    parser.add_argument("--profile", help="configs/<profile>.yaml (env RAG_STREAM_PROFILE)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API (embedded defaults unless URLs are set)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="apply Alembic migrations").set_defaults(func=cmd_db_upgrade)

    local_note = (
        "Runs in-process on the configured stores. Qdrant in local mode locks its folder, so "
        "stop a `rag-stream serve` that uses the same data dir first (or set "
        "RAG_STREAM_QDRANT_URL to a Qdrant server both share)."
    )
    ingest = sub.add_parser(
        "ingest",
        help="ingest files and folders (recursively) into a knowledge base",
        description="Ingest .txt, .md, .html and .pdf files into a knowledge base (created if "
        "missing); re-ingesting a changed file replaces it. " + local_note,
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    ingest.add_argument("--kb", required=True, help="knowledge base name")
    ingest.add_argument("--no-progress", action="store_true", help="no progress bar")
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
    search.set_defaults(func=cmd_search)

    prep = sub.add_parser("prepare-models", help="prepare the default LLM and embedder once")
    prep.add_argument("--force", action="store_true", help="rebuild even if prepared")
    prep.add_argument("--no-verify", action="store_true", help="skip the generation check")
    prep.set_defaults(func=cmd_prepare_models)
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
