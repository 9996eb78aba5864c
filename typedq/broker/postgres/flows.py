"""The PostgreSQL broker's capability Flows (workflows, :mod:`typedq.broker.flow`), mixed
into PostgresBroker: flows stored by one call of the schema's ``enqueue_flows`` (each flow
atomically, as ``enqueue_flow`` stores it), and a flow's state read. The hand-offs happen in the schema itself (triggers of
migration 6, :mod:`.migration_6`), in the transaction that finished each job, so the
worker's calls (complete, fail, ...) know nothing of flows and a job with no flow pays
nothing for them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ...errors import InvalidOption
from ...options import check_numbers
from ..base import EnqueueOutcome, JobMessage
from ..flow import FlowSpec, FlowState, msgpack_bin
from .connection import REFUSALS, refusal
from .core import PostgresCore
from .rows import encode
from .within import enqueue_flow_within, within_error

__all__ = ["FlowOps", "hole_of", "links_hole_of"]

#: A payload no real one is: its place in an encoded envelope is where a held step's
#: input goes (the envelope is array-like, so the place does not depend on the payload).
_MARK = b"\xfetypedq-held-step-payload\xfe"
_MARK_BIN = msgpack_bin(_MARK)


def hole_of(message: JobMessage) -> int:
    """The byte offset of ``message``'s empty payload (``bin 0``) in its encoding, where
    the hand-off splices a held step's input (``flow_release`` in migration 6)."""
    marked = encode(msgspec.structs.replace(message, payload=_MARK))
    at = marked.index(_MARK_BIN)
    plain = encode(message)
    assert plain[at : at + 2] == b"\xc4\x00", "a held step's payload must be empty"
    return at


_LINKS_MARK = "typedq-held-step-links\x7f"


def links_hole_of(message: JobMessage) -> int:
    """The byte offset of ``message``'s empty ``trace_links`` (fixstr ``""``) in its
    encoding, where the fan-in writes its members' spans (``flow_release``)."""
    marked = encode(msgspec.structs.replace(message, trace_links=_LINKS_MARK))
    at = marked.index(encode(_LINKS_MARK))
    assert encode(message)[at] == 0xA0, "a held step's trace_links must be empty"
    return at


class FlowOps(PostgresCore):
    """Workflows on the PostgreSQL broker."""

    async def enqueue_flows(self, flows: Sequence[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        self._check()
        prepared = [self._flow_args(spec) for spec in flows]
        queues = sorted({q for args in prepared for q in args[8]})
        if queues:
            await self._register_queues(queues)
        if not flows:
            return []
        # One call for the batch: per flow its own columns, the jobs' columns end to end.
        rows = await self._fetch(
            "enqueue_flows",
            self._sql["enqueue_flows"],
            self.ns,
            *([args[k] for args in prepared] for k in (1, 2, 3, 4, 5, 6, 18)),
            [len(args[7]) for args in prepared],
            *([x for args in prepared for x in args[k]] for k in range(7, 15)),
            [args[15] for args in prepared],
            prepared[0][16],
            self.channel,
        )
        out: list[EnqueueOutcome | Exception] = []
        for spec, args, row in zip(flows, prepared, rows, strict=True):
            code = row["code"]
            if code in REFUSALS:
                out.append(refusal(code, row["info"], args[15]))
            else:
                out.append(EnqueueOutcome(spec.id, code == "0"))
        return out

    async def enqueue_flows_within(
        self, conn: object, flows: Sequence[FlowSpec]
    ) -> list[EnqueueOutcome]:
        """Store ``flows`` in the transaction open on ``conn`` (see
        :mod:`typedq.broker.postgres.within`), each by one call of ``enqueue_flow``: they
        exist if and only if it commits. A refused flow raises (the transaction is
        aborted with it)."""
        self._check()
        prepared = [self._flow_args(spec) for spec in flows]
        queues = sorted({q for args in prepared for q in args[8]})
        if queues:
            await self._register_queues(queues)
        out = []
        for spec, args in zip(flows, prepared, strict=True):
            try:
                code = await enqueue_flow_within(
                    conn, self.target.schema, self._sql["enqueue_flow"], args
                )
            except InvalidOption:
                raise
            except Exception as exc:
                raise within_error(exc, self.target.safe, args[15]) from exc
            out.append(EnqueueOutcome(spec.id, code == 0))
        return out

    def _flow_args(self, spec: FlowSpec) -> tuple[Any, ...]:
        """The arguments of ``enqueue_flow`` for ``spec`` (its envelopes checked first)."""
        messages = [*spec.members, *spec.steps]
        check_numbers(messages)
        args = self._enqueue_args(messages)
        held = [False] * len(spec.members) + [k > 0 or spec.fan_out for k in range(len(spec.steps))]
        holes = [hole_of(m) if h else 0 for m, h in zip(messages, held, strict=True)]
        r = self.settings.retention
        return (
            self.ns,
            spec.id,
            len(spec.steps),
            len(spec.members),
            spec.fan_out,
            spec.collector,
            spec.collect,
            args[1],
            args[2],
            args[3],
            args[4],
            holes,
            args[9],
            args[10],
            args[11],
            args[7],
            [r.completed_max, r.failed_max],
            self.channel,
            # A fan-in callback that carries a trace context links to its members' spans.
            links_hole_of(spec.steps[0])
            if spec.fan_out and not spec.collector and spec.steps[0].trace_context
            else None,
        )

    async def flow_state(self, flow_id: str, *, queue: str | None = None) -> FlowState | None:
        rows = await self._fetch("flow_state", self._sql["flow_state"], self.ns, flow_id, read=True)
        row = rows[0]
        if row["steps"] is not None:
            return FlowState(
                id=row["fid"],
                steps=row["steps"],
                members=row["members"],
                pending=row["remaining"],
                completed=row["completed"],
                failed=row["failed"],
                cancelled=row["cancelled"],
            )
        shape = row["shape"]
        if shape is None:
            return None
        return FlowState(id=row["fid"], steps=shape[0], members=shape[1], pending=-1)
