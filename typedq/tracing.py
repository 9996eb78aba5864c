"""OpenTelemetry traces: a ``send`` span per enqueue, a ``process`` span per attempt.

Turned on per app: ``App("billing", tracing=True)`` (or ``tracing=Tracing(provider)``),
the same for a :class:`~typedq.Producer` or a :class:`~typedq.Client`. It needs the
``otel`` extra (``pip install 'typedq[otel]'``: opentelemetry-api only); the spans go
wherever the application's TracerProvider sends them (the SDK and an exporter are the
application's choice). Without ``tracing`` nothing here is imported and the job path
pays one ``is None`` test per enqueue and per attempt.

Spans follow the OpenTelemetry messaging semantic conventions:

- ``send {queue}`` (kind PRODUCER) around an enqueue, until the broker stored the job.
  One span per ``enqueue``; ONE span for a whole ``enqueue_many`` (attribute
  ``messaging.batch.message_count``) whose context every job of the batch carries; one
  span for a workflow's enqueue whose context every job of the flow carries.
- ``process {queue}`` (kind CONSUMER) around one attempt of the handler, a child of the
  producer's span: the producer's context travels in the envelope
  (:attr:`JobMessage.trace_context`, written with the global propagator, W3C
  ``traceparent``/``tracestate`` by default) across processes and brokers. The
  handler runs inside it, so its own spans (an HTTP call, a query) are its children.
  A failed attempt sets the span's status to ERROR and records an ``exception`` event
  (type, message, traceback of the FailureRecord).

Attributes: ``messaging.system=typedq``, ``messaging.destination.name`` (the queue),
``messaging.operation.type`` (``send``/``process``), ``messaging.operation.name``,
``messaging.message.id`` (the job id; on a single send and on every process span),
``typedq.task``, ``typedq.attempt`` and ``typedq.outcome`` on process spans.

A workflow is one trace: every step, member and callback carries the context of the
flow's ``send`` span, so their process spans are its children (siblings of each other,
not a chain of parents: a released step's context is fixed at enqueue). The fan-in
callback therefore shares the members' trace; it carries no links to them, since the
members' spans do not exist when the flow is enqueued.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, StatusCode, TracerProvider

from .broker.base import ClaimedJob, JobMessage
from .observe import outcome_of
from .outcomes import Fail, HandBack, Outcome

if TYPE_CHECKING:
    from .broker.flow import FlowSpec

__all__ = ["Processing", "Tracing", "decode_carrier", "encode_carrier", "tracing_from"]

T = TypeVar("T")

SYSTEM = "typedq"


def encode_carrier(carrier: dict[str, str]) -> str:
    """A propagator's carrier as ``key=value`` lines (header values hold no newline)."""
    return "\n".join(f"{k}={v}" for k, v in carrier.items() if "\n" not in k + v)


def decode_carrier(text: str) -> dict[str, str]:
    """The carrier of :func:`encode_carrier`; malformed lines are skipped."""
    carrier: dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            carrier[key] = value
    return carrier


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("typedq")
    except PackageNotFoundError:  # a source tree that is not installed
        return "0"


class Tracing:
    """Where an app's spans go: a tracer from ``tracer_provider`` (default: the global one).

    :param tracer_provider: the provider to get the tracer from; None uses the global
        provider at the time of each span (set it whenever you like, before or after)
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("typedq", _version(), tracer_provider=tracer_provider)

    def __repr__(self) -> str:
        return f"Tracing({self.tracer!r})"

    def _context(self) -> str:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return encode_carrier(carrier)

    # -- producer side -----------------------------------------------------------------

    async def send(self, message: JobMessage, submit: Callable[[JobMessage], Awaitable[T]]) -> T:
        """``submit(message)`` inside a ``send {queue}`` span; the message carries it."""
        attributes = _attributes("send", message.queue)
        attributes["messaging.message.id"] = message.id
        attributes["typedq.task"] = message.task
        with self.tracer.start_as_current_span(
            f"send {message.queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carried = msgspec.structs.replace(message, trace_context=self._context())
            return await submit(carried)

    async def send_many(
        self, messages: list[JobMessage], submit: Callable[[list[JobMessage]], Awaitable[T]]
    ) -> T:
        """``submit(messages)`` inside one ``send`` span whose context every job carries."""
        queues = {m.queue for m in messages}
        queue = queues.pop() if len(queues) == 1 else ""
        attributes = _attributes("send", queue)
        attributes["messaging.batch.message_count"] = len(messages)
        tasks = {m.task for m in messages}
        if len(tasks) == 1:
            attributes["typedq.task"] = tasks.pop()
        with self.tracer.start_as_current_span(
            f"send {queue}" if queue else "send", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            context = self._context()
            carried = [msgspec.structs.replace(m, trace_context=context) for m in messages]
            return await submit(carried)

    async def send_flow(self, spec: FlowSpec, submit: Callable[[FlowSpec], Awaitable[T]]) -> T:
        """``submit(spec)`` inside one ``send`` span whose context every job of the flow
        carries (members, steps, the callback)."""
        last = spec.steps[-1]
        attributes = _attributes("send", last.queue)
        attributes["messaging.message.id"] = spec.id
        attributes["messaging.batch.message_count"] = len(spec.steps) + len(spec.members)
        attributes["typedq.task"] = last.task
        attributes["typedq.flow"] = True
        with self.tracer.start_as_current_span(
            f"send {last.queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            context = self._context()
            carried = msgspec.structs.replace(
                spec,
                steps=_carry(spec.steps, context),
                members=_carry(spec.members, context),
            )
            return await submit(carried)

    # -- worker side -------------------------------------------------------------------

    def process(self, claimed: ClaimedJob) -> Processing:
        """Start the ``process {queue}`` span of an attempt and make it current; the
        caller ends it with :meth:`Processing.end` in the same task."""
        message = claimed.message
        parent = otel_context.Context()
        if message.trace_context:
            parent = propagate.extract(decode_carrier(message.trace_context), context=parent)
        attributes = _attributes("process", message.queue)
        attributes["messaging.message.id"] = message.id
        attributes["typedq.task"] = message.task
        attributes["typedq.attempt"] = claimed.attempt
        span = self.tracer.start_span(
            f"process {message.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return Processing(span, token)


def _attributes(operation: str, queue: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if queue:
        attributes["messaging.destination.name"] = queue
    return attributes


def _carry(messages: Sequence[JobMessage], context: str) -> tuple[JobMessage, ...]:
    return tuple(msgspec.structs.replace(m, trace_context=context) for m in messages)


class Processing:
    """A running attempt's span, current in its task until :meth:`end`."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span, token: object) -> None:
        self.span = span
        self.token = token

    def end(self, outcome: Outcome | None) -> None:
        """End the span with ``outcome`` (None: the attempt was interrupted)."""
        otel_context.detach(self.token)  # type: ignore[arg-type]  # the token attach() gave
        span = self.span
        if outcome is None:
            span.set_status(StatusCode.ERROR, "interrupted")
            span.end()
            return
        span.set_attribute("typedq.outcome", outcome_of(outcome).value)
        if isinstance(outcome, Fail):
            record = outcome.record
            span.set_status(StatusCode.ERROR, f"{record.error_type}: {record.message}")
            span.add_event(
                "exception",
                {
                    "exception.type": record.error_type,
                    "exception.message": record.message,
                    "exception.stacktrace": record.traceback or "",
                },
            )
            span.set_attribute("error.type", record.error_type)
        elif isinstance(outcome, HandBack):
            span.set_attribute("typedq.released", True)
        span.end()


def tracing_from(option: bool | Tracing | None) -> Tracing | None:
    """The app option ``tracing=`` as a :class:`Tracing` (None when off)."""
    if option is None or option is False:
        return None
    if option is True:
        return Tracing()
    return option
