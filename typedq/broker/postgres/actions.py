"""The PostgreSQL broker's capability OperatorActions, mixed into PostgresBroker: retry,
remove and purge (``typedq inspect``, the dashboard; a job of a workflow as
:mod:`typedq.broker.flow` says)."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import JobState, RetryOutcome
from .core import PostgresCore
from .rows import CODE, RETRY

__all__ = ["OperatorOps"]


class OperatorOps(PostgresCore):
    """Operator actions of the PostgreSQL broker."""

    async def retry(self, ids: Sequence[str], *, queue: str | None = None) -> list[RetryOutcome]:
        if not ids:
            self._check()
            return []
        r = self.settings.retention
        codes = await self._fetchval(
            "retry",
            self._sql["retry"],
            self.ns,
            list(ids),
            self.channel,
            [r.completed_max, r.failed_max],
        )
        return [RETRY[c] for c in codes]

    async def remove(
        self,
        ids: Sequence[str],
        *,
        states: Sequence[JobState] | None = None,
        queue: str | None = None,
    ) -> list[bool]:
        if not ids:
            self._check()
            return []
        codes = None if states is None else [CODE[state] for state in states]
        gone = set(
            await self._fetchval(
                "remove", self._sql["remove"], self.ns, list(ids), codes, None, self.channel
            )
        )
        await self._finish_flows()
        # Ids are acted on in order: an id repeated is deleted by its first mention.
        out = []
        for job_id in ids:
            out.append(job_id in gone)
            gone.discard(job_id)
        return out

    async def purge(self, queue: str, states: Sequence[JobState]) -> int:
        if not states:
            self._check()
            return 0
        gone = await self._fetchval(
            "purge",
            self._sql["remove"],
            self.ns,
            None,
            [CODE[state] for state in states],
            queue,
            self.channel,
        )
        await self._finish_flows()
        return len(gone)
