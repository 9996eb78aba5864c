"""``typedq migrate`` (SPEC section 10): a fresh schema is reported pending by --check
(exit 1, nothing applied), migrated once (exit 0, from which version to which), then up
to date; brokers with no schema say so."""

from __future__ import annotations

import itertools

import anyio
import asyncpg
import pytest

from tests.pg_harness import PgCluster
from typedq.broker.postgres.schema import MIGRATIONS
from typedq.cli import main

pytestmark = pytest.mark.postgres

_schemas = itertools.count()


def test_migrate_checks_applies_once_and_reports_up_to_date(
    pg_cluster: PgCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = f"cli_{next(_schemas)}"
    url = f"{pg_cluster.url}?schema={schema}"
    newest = len(MIGRATIONS)
    assert main(["migrate", "--broker", url, "--check"]) == 1
    out = capsys.readouterr().out
    assert f"schema {schema!r} is at version 0; this release needs {newest}" in out
    assert main(["migrate", "--broker", url, "--check"]) == 1  # --check applied nothing
    capsys.readouterr()
    assert main(["migrate", "--broker", url]) == 0
    assert f"schema {schema!r} migrated from version 0 to {newest}" in capsys.readouterr().out
    assert main(["migrate", "--broker", url]) == 0
    assert f"schema {schema!r} is up to date (version {newest})" in capsys.readouterr().out
    assert main(["migrate", "--broker", url, "--check"]) == 0


def test_a_schema_a_newer_release_migrated_is_reported_not_touched(
    pg_cluster: PgCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema at a version this release does not know (a newer typedq migrated it):
    migrate and --check say so and change nothing (exit 0: nothing is pending here)."""
    schema = f"cli_{next(_schemas)}"
    url = f"{pg_cluster.url}?schema={schema}"
    newest = len(MIGRATIONS)
    assert main(["migrate", "--broker", url]) == 0
    capsys.readouterr()

    async def stamp_newer() -> None:
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            await conn.execute(
                f'INSERT INTO "{schema}".migrations (version) VALUES ($1)',  # noqa: S608 -- the test's own schema name
                newest + 1,
            )
        finally:
            await conn.close()

    anyio.run(stamp_newer)
    for args in ([], ["--check"]):
        assert main(["migrate", "--broker", url, *args]) == 0
        out = capsys.readouterr().out
        assert f"schema {schema!r} is at version {newest + 1}, newer than this release" in out
        assert f"knows ({newest}): nothing to do here" in out


def test_migrate_without_a_schema_to_migrate_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["migrate", "--broker", "redis://127.0.0.1:1/0"]) == 0
    assert "nothing to migrate (Redis keeps no schema" in capsys.readouterr().out
    assert main(["migrate", "--broker", "memory://"]) == 2
    assert "memory:// is this process's own embedded broker" in capsys.readouterr().err
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert "typedq migrate needs MODULE:APP or --broker URL" in err
    assert err.count("\n") == 1


def test_inspect_shows_a_postgres_brokers_counts(
    pg_cluster: PgCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The overview needs the core alone: a broker without schedules shows none."""
    schema = f"cli_{next(_schemas)}"
    url = f"{pg_cluster.url}?schema={schema}"
    assert main(["inspect", "--broker", url, "--app", "billing"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps to the terminal's width
    assert "app 'billing' on postgresql://" in out
    assert "│ default │ 0 │ 0 │ 0 │ 0 │ 0 │ 0 │" in out
    assert "no failed jobs" in out
