"""The PostgreSQL broker's schema registry (capability ``SchemaRegistry``) and its count
of a queue's jobs by fingerprint (capability ``FingerprintCounts``), mixed into
PostgresBroker: what ``typedq verify`` reads.

The registry is the table ``schemas`` (migration 7): one row per namespace, task and
fingerprint, the first record of it kept with the database's time of its insert (the
broker's clock), as the embedded broker and Redis keep it. A call is one statement
whatever the number of records, so one round trip.

Counting reads the page ``page_jobs`` would answer (same order, same keyset cursors) and
groups its jobs by the task and fingerprint their stored messages carry, in the database
(:func:`.statements.count_statements`): one statement per page, only the counts come
back. The page is read from the state's index at the cursor (every state: the
active and scheduled orders since migration 12), and is at most
:data:`COUNT_PAGE_MAX` jobs, so one call's work does not grow with the queue
(bench/pg_fingerprint_counts.py: 5-12 ms per page of 500 at 100,000 waiting jobs).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...names import check_name
from ..base import JobState
from ..schemas import FingerprintPage, SchemaRecord
from .core import PostgresCore
from .rows import page_cursor
from .statements import page_args

__all__ = ["COUNT_PAGE_MAX", "SchemaOps"]

#: The most jobs one ``count_fingerprints`` call counts (Redis's bound too; verify asks
#: for 500), so that no call holds a backend for long.
COUNT_PAGE_MAX = 2000


class SchemaOps(PostgresCore):
    """``record_schemas``, ``schema_records``, ``forget_schemas`` and
    ``count_fingerprints`` of the PostgreSQL broker."""

    _count_sql: dict[JobState, str]

    async def record_schemas(self, records: Sequence[SchemaRecord]) -> list[bool]:
        if not records:
            self._check()
            return []
        rows = await self._fetch(
            "record_schemas",
            self._sql["record_schemas"],
            self.ns,
            [r.task for r in records],
            [r.fingerprint for r in records],
            [r.input_schema for r in records],
            [r.output_schema for r in records],
        )
        return [bool(row["kept"]) for row in rows]

    async def schema_records(self) -> list[SchemaRecord]:
        rows = await self._fetch("schema_records", self._sql["schema_records"], self.ns, read=True)
        return [
            SchemaRecord(
                task=row["task"],
                fingerprint=row["fingerprint"],
                input_schema=row["input_schema"],
                output_schema=row["output_schema"],
                first_seen=row["first_seen"],
            )
            for row in rows
        ]

    async def forget_schemas(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        if not keys:
            self._check()
            return []
        rows = await self._fetch(
            "forget_schemas",
            self._sql["forget_schemas"],
            self.ns,
            [task for task, _ in keys],
            [fingerprint for _, fingerprint in keys],
        )
        return [bool(row["gone"]) for row in rows]

    async def count_fingerprints(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 1000
    ) -> FingerprintPage:
        check_name("queue", queue)
        limit = max(1, min(limit, COUNT_PAGE_MAX))
        args = [self.ns, queue, *page_args(state, cursor, limit)]
        rows = await self._fetch("count_fingerprints", self._count_sql[state], *args, read=True)
        counts: dict[tuple[str, str], int] = {}
        following: str | None = None
        for row in rows:
            if row["task"] is None:
                following = page_cursor(state, row)
            else:
                counts[(row["task"], row["fp"])] = int(row["n"])
        return FingerprintPage(counts=counts, jobs=sum(counts.values()), cursor=following)
