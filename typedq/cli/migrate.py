"""``typedq migrate MODULE:APP | --broker URL``: bring a broker's stored layout to this
release's version before a deploy (SPEC section 10).

The PostgreSQL broker keeps a versioned schema (``typedq.broker.postgres.schema``): this
applies the migrations it lacks, under the advisory lock that makes concurrent starts
safe, and says from which version to which. ``--check`` applies nothing and exits 1 when
migrations are pending (a deploy pipeline's gate). Redis keeps no schema: its key layout
is moved when a broker connects, so there is nothing to do there.
"""

from __future__ import annotations

import argparse

import anyio

from ..broker import broker_from_url, redact_url
from ..broker.base import BrokerSettings
from ..errors import ConfigError
from .common import load_app

__all__ = ["add_migrate_parser", "migrate_command"]


def add_migrate_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: list[argparse.ArgumentParser],
) -> None:
    """The ``migrate`` subcommand's arguments."""
    migrate = sub.add_parser(
        "migrate",
        parents=parents,
        help="migrate the broker's stored schema to this release (PostgreSQL)",
        description="Apply the schema migrations the broker lacks (the PostgreSQL broker: "
        "versioned, idempotent, safe while workers start). Exit 0 when up to date; with "
        "--check, 1 when migrations are pending (nothing applied).",
    )
    migrate.add_argument(
        "app", nargs="?", default=None, help="MODULE:APP whose broker to migrate (or --broker)"
    )
    migrate.add_argument(
        "--check",
        action="store_true",
        help="apply nothing; exit 1 if migrations are pending",
    )


def migrate_command(args: argparse.Namespace) -> int:
    """Run ``typedq migrate``; the exit code."""
    url = args.broker
    if url is None:
        if args.app is None:
            raise ConfigError(
                "typedq migrate needs MODULE:APP or --broker URL (e.g. --broker "
                "postgresql://user@host:5432/db)"
            )
        url = load_app(args.app).client.url
    scheme = url.partition("://")[0]
    where = redact_url(url)
    if scheme not in ("postgresql", "postgres"):
        if scheme == "memory":
            raise ConfigError(
                "memory:// is this process's own embedded broker: it stores nothing to "
                "migrate; give --broker postgresql://HOST:PORT/DB"
            )
        print(
            f"{where}: nothing to migrate (Redis keeps no schema; its key layout is moved "
            "when a broker connects)"
        )
        return 0
    from ..broker.postgres import PostgresBroker

    broker = broker_from_url(url, BrokerSettings())
    assert isinstance(broker, PostgresBroker)
    schema = broker.target.schema
    had, newest = anyio.run(lambda: broker.schema_versions(apply=not args.check))
    if had > newest:
        # A newer release migrated it (a rolling deploy, or this host runs an old typedq).
        print(
            f"{where}: schema {schema!r} is at version {had}, newer than this release "
            f"knows ({newest}): nothing to do here; a newer typedq migrated it (upgrade "
            "typedq on this host to that release)"
        )
        return 0
    if had == newest:
        print(f"{where}: schema {schema!r} is up to date (version {had})")
        return 0
    if args.check:
        print(
            f"{where}: schema {schema!r} is at version {had}; this release needs {newest} "
            f"({newest - had} migrations pending: run typedq migrate)"
        )
        return 1
    print(f"{where}: schema {schema!r} migrated from version {had} to {newest}")
    return 0
