"""The client: a connection to an app's broker plus auto-batching of enqueues.

Every :class:`~typedq.App` and :class:`~typedq.Producer` (the stub app of a producer
service that cannot import the worker's code, :mod:`typedq.producer`) owns a Client;
``typedq inspect``, and the dashboard given ``--app NAME``, use one directly. Nothing here
imports the worker runtime.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from .batching import Batcher, is_batch_wide
from .broker import broker_from_url, redact_url
from .broker.base import Broker, BrokerSettings, EnqueueControl, EnqueueOutcome, JobMessage
from .broker.capabilities import SchemaRegistry, TransactionalEnqueue, require, supports
from .broker.flow import FlowSpec
from .broker.runs import AppendOutcome, RunAppend, RunRecord, RunSpec
from .errors import (
    BrokerError,
    ConfigError,
    NotConnected,
    PartialEnqueue,
    QueueFull,
    Unsupported,
)
from .names import check_name
from .options import check_message

if TYPE_CHECKING:
    from .serde import Codec
    from .tracing import Tracing

__all__ = ["DEFAULT_BROKER_ENV", "Client", "load_tracing"]

#: The environment variable that names the broker URL when none is given.
DEFAULT_BROKER_ENV = "TYPEDQ_BROKER"

log = logging.getLogger("typedq.client")

#: Whether this process was told (once) that jobs went to an embedded broker no worker
#: of this process serves.
_warned_unserved = False

#: Per broker object: the ``(task, fingerprint)`` pairs this process recorded in its
#: schema registry, so each is sent once per process, whoever connects again.
_recorded: weakref.WeakKeyDictionary[Broker, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


def _append_batch_wide(exc: Exception) -> bool:
    """Which errors of a batch of run appends are the whole batch's: those of
    :func:`~typedq.batching.is_batch_wide` but a full queue, which is one append's steps'
    queue (the script refuses before it writes: the others are sent again alone)."""
    return not isinstance(exc, QueueFull) and is_batch_wide(exc)


class Client:
    """A connection to a broker for enqueueing and inspecting jobs.

    :param broker: a URL (``memory://``, ``redis://...``), a Broker, or ``None`` for the
        URL in ``$TYPEDQ_BROKER``, else the embedded broker
    :param name: the app namespace; must match the worker's ``App(name)``
    :param settings: broker-wide settings (the App passes its own)
    :param batch_size: the most enqueues coalesced into one broker call
    :param tracing: OpenTelemetry spans for enqueues (and, for an App, its workers):
        True, or a :class:`~typedq.tracing.Tracing`; needs ``typedq[otel]`` (see
        docs/observability.md)
    """

    def __init__(
        self,
        broker: str | Broker | None = None,
        *,
        name: str = "typedq",
        settings: BrokerSettings | None = None,
        batch_size: int = 500,
        tracing: bool | Tracing = False,
    ) -> None:
        self.name = check_name("app", name)
        #: The app's tracing (typedq.tracing); None: off, and the job path pays nothing.
        self.tracing: Tracing | None = load_tracing(tracing)
        settings = settings or BrokerSettings(namespace=name)
        # The embedded broker by default (no broker given, none in the environment):
        # jobs enqueued while no worker of this process serves it are told once.
        self._default_memory = broker is None and not os.environ.get(DEFAULT_BROKER_ENV)
        #: Workers of this process running on this client's broker.
        self.workers = 0
        if broker is None:
            broker = os.environ.get(DEFAULT_BROKER_ENV) or "memory://"
        self.url = broker if isinstance(broker, str) else f"<{type(broker).__name__}>"
        self.broker: Broker = (
            broker_from_url(broker, settings) if isinstance(broker, str) else broker
        )
        self._enqueuer: Batcher[JobMessage, EnqueueOutcome] = Batcher(
            self._enqueue_batch, max_batch=batch_size, name="enqueue batcher"
        )
        # Workflows (typedq.workflow): concurrent flow enqueues share a broker call too.
        self._flow_enqueuer: Batcher[FlowSpec, EnqueueOutcome | Exception] = Batcher(
            self._enqueue_flow_batch, max_batch=64, name="flow enqueue batcher"
        )
        # Durable runs (typedq.durable): the reads of concurrent turns share a broker call,
        # and so do their appends and the starts of runs, on a broker that does I/O
        # (Broker.coalesce_run_calls), two calls of each in flight. An append refused for
        # a full queue is the refusal of its own steps' queue: the others of its batch
        # are sent again without it.
        self._run_reader: Batcher[str, RunRecord | None] = Batcher(
            self.broker.get_runs, max_batch=64, max_in_flight=2, name="run read batcher"
        )
        self._run_creator: Batcher[RunSpec, tuple[bool, RunRecord]] = Batcher(
            self.broker.create_runs, max_batch=64, max_in_flight=2, name="run start batcher"
        )
        self._run_appender: Batcher[RunAppend, AppendOutcome] = Batcher(
            self.broker.append_runs,
            max_batch=64,
            max_in_flight=2,
            name="run append batcher",
            batch_wide=_append_batch_wide,
        )
        self._stack: contextlib.AsyncExitStack | None = None
        self._users = 0
        #: The broker capabilities (typedq.broker.capabilities) the app using this client
        #: declares a need for, each with what needs it; checked once, at connect.
        self.requirements: Callable[[], Mapping[type[Any], str]] = dict
        #: The tasks of the app using this client as ``(name, input codec, output
        #: codec)``: their schemas are recorded in the broker's schema registry
        #: (typedq.broker.schemas) once per process, at connect.
        self.schema_sources: Callable[[], Sequence[tuple[str, Codec[Any], Codec[Any]]]] = list

    def __repr__(self) -> str:
        return f"Client({redact_url(self.url)!r}, name={self.name!r})"

    @property
    def client(self) -> Client:
        """This client (so tasks can bind to an App or a Client alike)."""
        return self

    @property
    def connected(self) -> bool:
        """True inside ``async with``."""
        return self._stack is not None

    async def __aenter__(self) -> Self:
        # Re-entrant: an App used as `async with app` inside a testing harness that
        # already entered it just bumps a counter.
        self._users += 1
        if self._stack is not None:
            return self
        stack = contextlib.AsyncExitStack()
        try:
            # Before connecting: a declared feature the broker lacks fails here, in one line.
            require(self.broker, self.requirements(), user=f"app {self.name!r}")
            await self.broker.connect()
            stack.push_async_callback(self.broker.close)
            await self._record_schemas()
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            await tg.start(self._enqueuer.run)
            await tg.start(self._flow_enqueuer.run)
            await tg.start(self._run_reader.run)
            await tg.start(self._run_creator.run)
            await tg.start(self._run_appender.run)
        except BaseException:
            self._users -= 1
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._users -= 1
        if self._users > 0 or self._stack is None:
            return
        stack, self._stack = self._stack, None
        await stack.aclose()

    async def _record_schemas(self) -> None:
        """Record this app's task schemas in the broker's schema registry (for ``typedq
        verify``): the pairs this process has not recorded yet, in one call, at connect,
        so no enqueue ever waits for it. A broker without a registry is skipped; one
        that fails here only costs a warning (the next connect tries again)."""
        if not supports(self.broker, SchemaRegistry):
            return
        done = _recorded.setdefault(self.broker, set())
        from .compat import schema_record

        records = [
            schema_record(name, given, output)
            for name, given, output in self.schema_sources()
            if (name, given.fingerprint) not in done
        ]
        if not records:
            return
        try:
            await self.broker.record_schemas(records)
        except BrokerError as exc:
            log.warning(
                "app %r: could not record its task schemas (typedq verify): %s", self.name, exc
            )
            return
        done.update((r.task, r.fingerprint) for r in records)

    def _require(self) -> None:
        if self._stack is None:
            raise NotConnected(
                f"{self!r} is not connected. Did you forget `async with app:` (or "
                "`async with client:`) around the code that enqueues?"
            )
        if self._default_memory and self.workers == 0:
            self._warn_unserved()

    def _warn_unserved(self) -> None:
        global _warned_unserved
        if not _warned_unserved:
            _warned_unserved = True
            log.warning(
                "app %r enqueued a job to memory://, the embedded broker, and no worker of "
                "this process runs: jobs there run only inside this process. Start a worker "
                "here (async with app.worker()), or set %s=redis://HOST:PORT/DB (or pass "
                "broker=) to reach workers elsewhere; broker='memory://' silences this",
                self.name,
                DEFAULT_BROKER_ENV,
            )

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """A worker of this process runs on this client's broker for the block."""
        self.workers += 1
        try:
            yield
        finally:
            self.workers -= 1

    async def read_run(self, run_id: str) -> RunRecord | None:
        """A durable run's record (``get_runs``), in one broker call with the reads of
        other turns of this process meanwhile where the broker coalesces them."""
        if self._stack is not None and self.broker.coalesce_run_calls:
            return await self._run_reader.submit(run_id)
        [record] = await self.broker.get_runs([run_id])
        return record

    async def create_run(self, spec: RunSpec) -> tuple[bool, RunRecord]:
        """Create a durable run (``create_runs``; idempotent by id), in one broker call
        with the other runs this process starts meanwhile where the broker coalesces
        them."""
        if self._stack is not None and self.broker.coalesce_run_calls:
            return await self._run_creator.submit(spec)
        [created] = await self.broker.create_runs([spec])
        return created

    async def append_run(self, append: RunAppend) -> AppendOutcome:
        """A durable run's compare-and-append (``append_runs``), in one broker call with
        the appends of other turns of this process meanwhile where the broker coalesces
        them (each is fenced by its run's log length: one sent again answers CONFLICT)."""
        if self._stack is not None and self.broker.coalesce_run_calls:
            return await self._run_appender.submit(append)
        [outcome] = await self.broker.append_runs([append])
        return outcome

    async def _enqueue_batch(self, messages: list[JobMessage]) -> list[EnqueueOutcome]:
        return await self.broker.enqueue(messages)

    async def enqueue(self, message: JobMessage) -> EnqueueOutcome:
        """Enqueue one job; concurrent calls are coalesced into one broker round trip.

        A call whose envelope the broker rejects fails alone: the others coalesced with
        it are re-sent without it (see :mod:`typedq.batching`).

        :raises InvalidName, InvalidOption: the envelope is malformed (nothing is sent)
        """
        return await self._enqueue(check_message(message))

    async def _enqueue(self, message: JobMessage) -> EnqueueOutcome:
        # For envelopes already checked (TaskBase.message): the check is not repeated.
        self._require()
        if self.tracing is not None:
            return await self.tracing.send(message, self._enqueuer.submit)
        return await self._enqueuer.submit(message)

    def _check_within(self) -> None:
        """Refuse ``within=`` on a broker that cannot store jobs in the caller's
        transaction, saying what to do instead."""
        if not supports(self.broker, TransactionalEnqueue):
            raise Unsupported(
                f"within= stores jobs in your database transaction, which needs the "
                f"PostgreSQL broker (postgresql://...), and this app's broker is "
                f"{redact_url(self.url)}: enqueue after your transaction commits (or write "
                "the jobs to an outbox table in it and enqueue them from there)"
            )

    async def _enqueue_within(
        self, conn: object, messages: list[JobMessage]
    ) -> list[EnqueueOutcome]:
        """Store checked envelopes in the caller's open database transaction (``within=``):
        one broker call through ``conn``, never coalesced with other enqueues (they are
        not in that transaction).

        :raises Unsupported: the broker cannot (its jobs do not live in the caller's
            database): says what to do instead
        """
        self._require()
        self._check_within()
        broker = self.broker
        if not messages:
            return []

        async def send(carried: list[JobMessage]) -> list[EnqueueOutcome]:
            outcomes = await broker.enqueue_within(conn, carried)
            if len(outcomes) != len(carried):
                raise RuntimeError(f"{broker!r} answered {len(outcomes)} of {len(carried)} jobs")
            return outcomes

        if self.tracing is not None:
            return await self.tracing.send_many(messages, send)
        return await send(messages)

    async def _enqueue_flow_within(self, conn: object, spec: FlowSpec) -> EnqueueOutcome:
        """Store one workflow in the caller's open database transaction (``within=``),
        as :meth:`_enqueue_within` stores jobs.

        :raises Unsupported: the broker cannot (see :meth:`_enqueue_within`)
        :raises QueueFull: its jobs would pass ``max_queue_length`` (nothing stored)
        """
        self._require()
        self._check_within()
        broker = self.broker

        async def send(carried: FlowSpec) -> EnqueueOutcome:
            (outcome,) = await broker.enqueue_flows_within(conn, [carried])
            return outcome

        if self.tracing is not None:
            return await self.tracing.send_flow(spec, send)
        return await send(spec)

    async def _enqueue_controlled(
        self, message: JobMessage, control: EnqueueControl
    ) -> EnqueueOutcome:
        """Enqueue one checked envelope under a unique window or debounce
        (typedq.flowcontrol): one broker call of its own, not coalesced with plain
        enqueues, so their path stays as it is."""
        self._require()

        async def submit(carried: JobMessage) -> EnqueueOutcome:
            (outcome,) = await self.broker.enqueue_controlled([(carried, control)])
            return outcome

        if self.tracing is not None:
            return await self.tracing.send(message, submit)
        return await submit(message)

    async def _enqueue_flow_batch(self, specs: list[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        return await self.broker.enqueue_flows(specs)

    async def _enqueue_flow(self, spec: FlowSpec) -> EnqueueOutcome:
        """Store one workflow (built by :mod:`typedq.workflow`); concurrent calls share a
        broker round trip.

        :raises QueueFull: its jobs would pass ``max_queue_length`` (nothing stored)
        """
        self._require()
        if self.tracing is not None:
            outcome = await self.tracing.send_flow(spec, self._flow_enqueuer.submit)
        else:
            outcome = await self._flow_enqueuer.submit(spec)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def enqueue_many(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        """Enqueue many jobs in chunks of ``batch_size``; one outcome per message, in order.

        Every envelope is checked before anything is sent. The chunks are stored in
        input order (jobs of equal priority are claimed in that order), each chunk
        atomically, in about one round trip on a networked broker.

        The contract when the broker refuses some chunks (QueueFull, a broker error):
        the chunks after a refused one are still tried; if at least one chunk was stored,
        :class:`~typedq.errors.PartialEnqueue` is raised, saying exactly which messages
        were stored and which were not (``exc.unsent``), chained to the first refusal.
        The ids are fixed before sending, so re-sending ``exc.unsent`` stores each job at
        most once. If no chunk was stored, the first refusal is raised itself.

        :raises PartialEnqueue: some chunks stored, some refused
        :raises QueueFull, BrokerError: nothing was stored
        :raises InvalidName, InvalidOption: an envelope is malformed (nothing is sent)
        """
        return await self._enqueue_many([check_message(m) for m in messages])

    async def _enqueue_many(self, messages: list[JobMessage]) -> list[EnqueueOutcome]:
        # For envelopes already checked (TaskBase.message): the check is not repeated.
        self._require()
        if not messages:
            return []
        if self.tracing is not None:
            return await self.tracing.send_many(messages, self._send_many)
        return await self._send_many(messages)

    async def _send_many(self, messages: list[JobMessage]) -> list[EnqueueOutcome]:
        size = self._enqueuer.max_batch
        chunks = [messages[i : i + size] for i in range(0, len(messages), size)]
        # One call for every chunk: the broker stores them in order (FIFO across chunks)
        # and answers for each, so a refusal never hides what the other chunks did.
        answers = await self.broker.enqueue_batches(chunks)
        if len(answers) != len(chunks):
            raise RuntimeError(f"{self.broker!r} answered {len(answers)} of {len(chunks)} chunks")
        outcomes: list[EnqueueOutcome | None] = []
        errors: list[Exception] = []
        for chunk, answer in zip(chunks, answers, strict=True):
            if isinstance(answer, Exception):
                errors.append(answer)
                outcomes += [None] * len(chunk)
            elif len(answer) != len(chunk):
                raise RuntimeError(f"{self.broker!r} answered {len(answer)} of {len(chunk)} jobs")
            else:
                outcomes += answer
        if not errors:
            return [o for o in outcomes if o is not None]
        if len(errors) == len(chunks):
            raise errors[0]
        raise PartialEnqueue(messages, outcomes, errors) from errors[0]


def load_tracing(option: bool | Tracing) -> Tracing | None:
    """The ``tracing=`` option as a Tracing, or None when off (nothing imported then).

    :raises ConfigError: tracing asked for without the ``otel`` extra installed
    """
    if option is False or option is None:
        return None
    try:
        from .tracing import tracing_from
    except ImportError as exc:
        raise ConfigError(
            f"tracing needs OpenTelemetry ({exc}); install it with: pip install 'typedq[otel]'"
        ) from None
    return tracing_from(option)
