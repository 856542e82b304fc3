"""The ``rag-stream`` command. Thin: parses arguments and calls into the packages."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rag_stream.errors import ConfigError
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
