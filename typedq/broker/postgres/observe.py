"""The PostgreSQL broker's capability Observability, mixed into PostgresBroker: the
per-minute rollups of finished jobs (``history``), the worker registry and the queue
registry."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ...names import check_worker_id
from ..base import HISTORY_MINUTES, MinuteRollup, WorkerInfo
from .core import PostgresCore
from .rows import decode_worker, encode

__all__ = ["ObserveOps"]


class ObserveOps(PostgresCore):
    """History and the registries of the PostgreSQL broker."""

    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        if not 1 <= minutes <= HISTORY_MINUTES:
            raise ValueError(f"minutes must be 1 to {HISTORY_MINUTES}, not {minutes}")
        if not queues:
            self._check()
            return []
        rows = await self._fetch(
            "history", self._sql["history"], self.ns, list(queues), minutes, read=True
        )
        current = int(rows[0]["cur"])
        found: dict[tuple[str, int], tuple[int, int, int]] = {
            (row["queue"], int(row["minute"])): (row["completed"], row["failed"], row["retried"])
            for row in rows
            if row["queue"] is not None
        }
        span = range(current - minutes + 1, current + 1)
        return [
            [MinuteRollup(m * 60, *found.get((queue, m), (0, 0, 0))) for m in span]
            for queue in queues
        ]

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        check_worker_id(info.id)
        await self._fetch(
            "register_worker",
            self._sql["register_worker"],
            self.ns,
            info.id,
            float(ttl),
            encode(info),
            list(info.queues),
        )

    async def unregister_worker(self, worker_id: str) -> None:
        await self._fetch(
            "unregister_worker", self._sql["unregister_worker"], self.ns, worker_id, read=True
        )

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._fetch("list_workers", self._sql["list_workers"], self.ns, read=True)
        workers = []
        for row in rows:
            try:
                workers.append(decode_worker(row["info"]))
            except msgspec.DecodeError:
                continue  # an entry of another typedq version
        return workers

    async def list_queues(self) -> list[str]:
        rows = await self._fetch("list_queues", self._sql["list_queues"], self.ns, read=True)
        return [row[0] for row in rows]
