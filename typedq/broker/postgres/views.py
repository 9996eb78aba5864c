"""The PostgreSQL broker's views of flow control (capability FlowViews,
:mod:`typedq.broker.flowviews`), mixed into PostgresBroker: pages of a queue's fair
keys, debounce keys, unique keys held and job streams, read from their tables.

Each page is one statement on an index, bounded by its limit, never by the number of
keys; cursors are keyset positions in that index (stable while a key stays):

- ``fair``: the queue's lanes (``fair_lanes``, migration 10) by primary key (priority,
  lane): each with its entries (its jobs waiting, counted in the lane's index, and the
  places of jobs that left meanwhile, which count until their turn comes, as on the
  other brokers) and the weight of its next turn (``next_weight``: its newest job's).
  A lane with no entry left (it goes at the next claim that reaches it) is passed over.
- ``debounce`` / ``unique``: the queue's markers (``ctl_markers``, migration 8) in
  their order (``seq``), each with its job's row: as on the embedded broker, a debounce
  key whose job is final or gone, and a unique key not held any more (its window ended,
  its job failed or was cancelled, or gone unfinished) are passed over. A unique key
  whose completed job retention already deleted is listed until its window ends (the
  marker keeps the end).
- ``stream``: the job streams (``streams``, migration 5) by job id, of this queue's jobs
  (streams have no queue of their own: a page examines at most ``SCAN_FACTOR * limit``
  of them, as the embedded broker does, and may be short before the end), with their
  entries and the readers whose registration holds now.
"""

from __future__ import annotations

from typing import Any

from ..base import bad_cursor
from ..flowviews import MAX_FLOW_PAGE, FlowKey, FlowKeyPage, FlowKind
from .core import PostgresCore

__all__ = ["SCAN_FACTOR", "ViewOps", "view_statements"]

#: Streams one page examines per key it may answer (other queues' are passed over).
SCAN_FACTOR = 10

#: A priority below every job's: the fair view's first cursor.
_FIRST_PRIORITY = -(2**31)


def view_statements(schema: str) -> dict[str, str]:
    """The statements of :class:`ViewOps` for the quoted ``schema``."""
    s = f'"{schema}"'
    return {
        "fair": (
            "SELECT l.priority, l.gate, l.next_weight, (SELECT count(*) "
            f"FROM {s}.jobs j WHERE j.ns = l.ns AND j.queue = l.queue AND j.state = 0 "
            "AND j.gate = l.gate AND j.priority = l.priority) + (SELECT count(*) "
            f"FROM {s}.fair_ghosts g WHERE g.ns = l.ns AND g.queue = l.queue "
            "AND g.gate = l.gate AND g.priority = l.priority) AS waiting "
            f"FROM {s}.fair_lanes l WHERE l.ns = $1 AND l.queue = $2 "
            "AND (l.priority, l.gate) > ($3::integer, $4::text) ORDER BY l.priority, l.gate LIMIT $5"
        ),
        "markers": (
            f"SELECT m.seq, m.marker, m.job_id, m.win, m.until, j.state, j.run_at, "
            f"j.finished_at, {s}.now_s() AS now "
            f"FROM {s}.ctl_markers m LEFT JOIN {s}.jobs j ON j.ns = m.ns AND j.id = m.job_id "
            "WHERE m.ns = $1 AND m.queue = $2 AND m.kind = $3 AND m.seq > $4 "
            "ORDER BY m.seq LIMIT $5"
        ),
        "streams": (
            "SELECT t.job_id, (j.queue = $2 AND t.expires > n.s) AS mine, "
            f"CASE WHEN j.queue = $2 THEN (SELECT count(*) FROM {s}.stream_entries e "
            "WHERE e.ns = t.ns AND e.job_id = t.job_id) END AS entries, "
            f"CASE WHEN j.queue = $2 THEN (SELECT count(*) FROM {s}.stream_readers r "
            "WHERE r.ns = t.ns AND r.job_id = t.job_id AND r.until > n.s) END AS readers "
            f"FROM (SELECT * FROM {s}.streams x WHERE x.ns = $1 AND x.job_id > $3 "
            "ORDER BY x.job_id LIMIT $4) t "
            f"CROSS JOIN (SELECT {s}.now_s() AS s) n "
            f"LEFT JOIN {s}.jobs j ON j.ns = t.ns AND j.id = t.job_id ORDER BY t.job_id"
        ),
    }


def _split(marker: str) -> tuple[str, str]:
    task, _, key = marker.partition("|")
    return task, key


def _hex_cursor(cursor: str) -> str:
    try:
        return bytes.fromhex(cursor).decode()
    except ValueError:
        raise bad_cursor(cursor) from None


class ViewOps(PostgresCore):
    """``flow_keys`` of the PostgreSQL broker (see the module)."""

    _view_sql: dict[str, str]

    async def flow_keys(
        self, queue: str, kind: FlowKind, *, cursor: str | None = None, limit: int = 100
    ) -> FlowKeyPage:
        limit = max(0, min(limit, MAX_FLOW_PAGE))
        if kind == "fair":
            return await self._fair_keys(queue, cursor, limit)
        if kind in ("debounce", "unique"):
            return await self._marker_keys(queue, kind, cursor, limit)
        if kind == "stream":
            return await self._stream_keys(queue, cursor, limit)
        raise ValueError(
            f"unknown flow-control kind {kind!r}: one of fair, debounce, unique, stream"
        )

    async def _fair_keys(self, queue: str, cursor: str | None, limit: int) -> FlowKeyPage:
        priority, gate = _FIRST_PRIORITY, ""
        if cursor is not None:
            level, _, lane = cursor.partition("|")
            if not level.lstrip("-").isdigit() or len(level) > 11:
                raise bad_cursor(cursor)
            priority, gate = int(level), _hex_cursor(lane)
        rows = await self._rows("fair", queue, priority, gate, limit)
        keys: list[FlowKey] = []
        for row in rows:
            if row["waiting"]:
                _, task, key = row["gate"].split("\x1f", 2)
                keys.append(
                    FlowKey(
                        kind="fair",
                        task=task,
                        key=key,
                        waiting=row["waiting"],
                        priority=row["priority"],
                        weight=row["next_weight"],
                    )
                )
        last = rows[-1] if rows and len(rows) >= limit else None
        return FlowKeyPage(
            keys, None if last is None else f"{last['priority']}|{last['gate'].encode().hex()}"
        )

    async def _marker_keys(
        self, queue: str, kind: FlowKind, cursor: str | None, limit: int
    ) -> FlowKeyPage:
        after = 0
        if cursor is not None:
            if not cursor.isdigit() or len(cursor) > 18:
                raise bad_cursor(cursor)
            after = int(cursor)
        rows = await self._rows("markers", queue, 0 if kind == "unique" else 1, after, limit)
        keys: list[FlowKey] = []
        for row in rows:
            task, key = _split(row["marker"])
            state, now = row["state"], row["now"]
            if kind == "debounce":
                if state is None or state >= 3:
                    continue
                until = row["run_at"] if state == 1 else None
            elif row["until"] is not None:
                # Its completed job is gone: held until the window the marker keeps.
                if row["until"] <= now:
                    continue
                until = row["until"]
            elif state is not None and state < 3:
                until = None
            elif state == 3 and row["finished_at"] + row["win"] > now:
                until = row["finished_at"] + row["win"]
            else:
                continue
            keys.append(FlowKey(kind=kind, task=task, key=key, job_id=row["job_id"], until=until))
        last = rows[-1] if rows and len(rows) >= limit else None
        return FlowKeyPage(keys, None if last is None else str(last["seq"]))

    async def _stream_keys(self, queue: str, cursor: str | None, limit: int) -> FlowKeyPage:
        after = "" if cursor is None else _hex_cursor(cursor)
        budget = max(1, limit) * SCAN_FACTOR
        rows = await self._rows("streams", queue, after, budget)
        keys: list[FlowKey] = []
        examined = 0
        for row in rows:
            if len(keys) >= limit:
                break
            examined += 1
            if row["mine"]:
                keys.append(
                    FlowKey(
                        kind="stream",
                        task="",
                        key="",
                        job_id=row["job_id"],
                        waiting=row["entries"],
                        readers=row["readers"],
                    )
                )
        more = examined < len(rows) or len(rows) >= budget
        last = rows[examined - 1]["job_id"] if examined else after
        return FlowKeyPage(keys, last.encode().hex() if more else None)

    async def _rows(self, name: str, queue: str, *args: Any) -> list[Any]:
        return await self._fetch(
            "flow_keys", self._view_sql[name], self.ns, queue, *args, read=True
        )
