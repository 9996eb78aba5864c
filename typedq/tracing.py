# The otel extra is optional: a type checker without it installed (an editable install,
# a monorepo) reads its names as Any instead of failing on this module's imports.
# mypy: disable-error-code="import-not-found"
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
not a chain of parents: a released step's context is fixed at enqueue). A fan-in
callback's process span also links to its members' process spans: a traced member's
completion (or final failure) carries its span's context (``Completion.span``, a W3C
``traceparent``), the broker keeps it with the member's result and, at the fan-in,
gives the callback the list (:attr:`JobMessage.trace_links`, the first
:data:`~typedq.broker.base.MAX_SPAN_LINKS` members), from which its span's links are
made. Only spans that are recorded are linked to (an unsampled member's span is
exported nowhere).

Cost: with no SDK installed (the API's no-op provider) no span is made at all; only a
context that came with the job is made current. The same when the producer did not
sample the trace and the provider's sampler follows the parent (the SDK's ParentBased,
its default): the span would be a non-recording one that nothing sees. Otherwise a span
that is not sampled costs the SDK's sampling decision and nothing else of ours (no
outcome attributes); the per-span floor that remains is the SDK's (docs/observability.md
has the figures and the sampler to use on busy queues).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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
        self._provider = tracer_provider
        #: Set once the provider is known to be a real one (see _noop).
        self._real = False
        #: The process spans' names and fixed attributes per (queue, task), built once.
        self._process_spans: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        #: Whether the provider's sampler drops every span whose remote parent was not
        #: sampled (the SDK's ParentBased with its defaults; see _noop).
        self._follows_parent = False
        #: The last envelope context extracted (with the propagator it was extracted
        #: by) and what it gave (the parent context, and False when that is a remote
        #: parent that was not sampled): the jobs of one enqueue_many or one flow carry
        #: the same one.
        self._last_carried: tuple[str, object] = ("", None)
        self._last_parent: tuple[otel_context.Context, bool] = (otel_context.Context(), True)

    def __repr__(self) -> str:
        return f"Tracing({self.tracer!r})"

    def _noop(self) -> bool:
        """Whether spans are the API's no-ops (no SDK installed): nothing records them,
        so none is made; only a context that came with the job is passed on."""
        if self._real:
            return False
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        if isinstance(provider, _NOOP_PROVIDERS):
            return True
        # A real provider stays: the global one is set once and never replaced.
        self._real = True
        self._follows_parent = _drops_unsampled_remote(getattr(provider, "sampler", None))
        return False

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

    def process(self, claimed: ClaimedJob, *, own_context: bool = False) -> Processing | None:
        """Start the ``process {queue}`` span of an attempt and make it current; the
        caller ends it with :meth:`Processing.end` in the same task (None: there is no
        span to end, the tracer is a no-op).

        :param own_context: the attempt runs in a contextvars context of its own that is
            dropped after it (the worker's runners): the span is made current without
            keeping a token to restore the previous context at the end
        """
        message = claimed.message
        carried = message.trace_context
        if carried:
            key = (carried, propagate.get_global_textmap())
            if key == self._last_carried:
                parent, sampled = self._last_parent
            else:
                found = _lone_traceparent(carried, key[1])
                if found is None:
                    parent = propagate.extract(decode_carrier(carried), context=_EMPTY)
                    remote = trace.get_current_span(parent).get_span_context()
                    sampled = remote.trace_flags.sampled or not remote.is_valid
                else:
                    parent, sampled = found
                self._last_carried, self._last_parent = key, (parent, sampled)
        else:
            parent, sampled = _EMPTY, True
        if self._noop() or (not sampled and self._follows_parent):
            # No span, but the producer's context is passed on (an enqueue in the
            # handler continues the trace, as a no-op span would have done): no SDK, or
            # a producer that did not sample this trace and a sampler that follows it
            # (the span would be a non-recording one that nothing ever sees).
            if not carried:
                return None
            token = otel_context.attach(parent)
            return None if own_context else Processing(trace.INVALID_SPAN, token)
        spec = self._process_spans.get((message.queue, message.task))
        if spec is None:
            fixed = _attributes("process", message.queue)
            fixed["typedq.task"] = message.task
            spec = self._process_spans[message.queue, message.task] = (
                f"process {message.queue}",
                fixed,
            )
        name, fixed = spec
        attributes = {
            **fixed,
            "messaging.message.id": message.id,
            "typedq.attempt": claimed.attempt,
        }
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=_links(message.trace_links) if message.trace_links else None,
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        # A fan-out member's id ends in '.m<index>' (typedq.broker.flow.member_id).
        member = ".m" in message.id and _MEMBER_ID.search(message.id) is not None
        return Processing(span, None if own_context else token, member)


_EMPTY = otel_context.Context()
_NOOP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)

#: What the default propagators (W3C trace context and baggage) write for a span with no
#: trace state and no baggage, ``traceparent=00-<32 hex>-<16 hex>-<2 hex>``: the common
#: envelope, parsed here without the propagator (and without a regular expression).
_TRACEPARENT_LEN = len("traceparent=00-") + 32 + 1 + 16 + 1 + 2
_HEX_OR_DASH = frozenset("0123456789abcdef-")
#: The two trace flags nearly every context has (not sampled, sampled), made once.
_FLAGS = (TraceFlags(0), TraceFlags(1))
#: Whether a global propagator is the default one, by identity (checked once each).
_DEFAULT_TEXTMAP: dict[int, bool] = {}


def _drops_unsampled_remote(sampler: object) -> bool:
    """Whether ``sampler`` (a provider's) is the SDK's ParentBased sampler that drops
    every span of a remote parent that was not sampled: its default, and what
    docs/observability.md recommends. Told by its public description (the last
    ``remoteParentNotSampled`` in it is its own, past a nested root's)."""
    try:
        from opentelemetry.sdk.trace.sampling import ParentBased
    except ImportError:  # no SDK: nothing to skip
        return False
    if type(sampler) is not ParentBased:
        return False
    # (untyped in the SDK)
    description = str(cast(Any, sampler).get_description())
    return description.rpartition("remoteParentNotSampled:")[2].startswith("AlwaysOffSampler")


def _is_default_textmap(textmap: object) -> bool:
    known = _DEFAULT_TEXTMAP.get(id(textmap))
    if known is None:
        parts = getattr(textmap, "_propagators", None)  # CompositePropagator's list
        known = (
            type(textmap) is CompositePropagator
            and isinstance(parts, list | tuple)
            and all(type(p) in (TraceContextTextMapPropagator, W3CBaggagePropagator) for p in parts)
        )
        _DEFAULT_TEXTMAP[id(textmap)] = known
    return known


def _lone_traceparent(carried: str, textmap: object) -> tuple[otel_context.Context, bool] | None:
    """The context the default propagators extract from a carrier holding only a
    version-00 ``traceparent`` (what they inject without trace state or baggage), made
    directly, and whether the parent was sampled; None for anything else (the
    propagator then extracts it)."""
    if (
        len(carried) != _TRACEPARENT_LEN
        or not carried.startswith("traceparent=00-")
        or carried[47] != "-"
        or carried[64] != "-"
        or not _HEX_OR_DASH.issuperset(carried[15:])
        or not _is_default_textmap(textmap)
    ):
        return None
    try:
        trace_id, span_id = int(carried[15:47], 16), int(carried[48:64], 16)
        flags = int(carried[65:], 16)
    except ValueError:  # a '-' inside a number
        return None
    if not trace_id or not span_id:
        return None
    remote = SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=_FLAGS[flags] if flags < 2 else TraceFlags(flags),
    )
    return trace.set_span_in_context(NonRecordingSpan(remote), _EMPTY), bool(flags & 1)


#: The end of a fan-out member's id (typedq.broker.flow.member_id).
_MEMBER_ID = re.compile(r"\.m[0-9]+$")
_TRACEPARENT_VALUE = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def _links(text: str) -> list[Link]:
    """Span links to the members' spans of a callback's ``trace_links`` (malformed
    entries skipped)."""
    links = []
    for value in text.split(","):
        match = _TRACEPARENT_VALUE.fullmatch(value)
        if match is None:
            continue
        trace_id, span_id = int(match[1], 16), int(match[2], 16)
        if trace_id and span_id:
            member = SpanContext(
                trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match[3], 16))
            )
            links.append(Link(member))
    return links


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

    __slots__ = ("member", "span", "token")

    def __init__(self, span: Span, token: object | None, member: bool = False) -> None:
        self.span = span
        #: Restores the context current before the span (None: the attempt's context is
        #: its own and is dropped after it).
        self.token = token
        #: The job is a fan-out member: :meth:`end` gives its span's context.
        self.member = member

    def end(self, outcome: Outcome | None) -> str:
        """End the span with ``outcome`` (None: the attempt was interrupted).

        :return: for a fan-out member's recorded span, its context as a W3C
            ``traceparent`` (the worker sends it with the outcome, for the fan-in
            callback's links); "" otherwise
        """
        if self.token is not None:
            otel_context.detach(cast(Any, self.token))  # attach() gave it
        span = self.span
        if not span.is_recording():
            span.end()  # not sampled: nothing to record
            return ""
        if outcome is None:
            span.set_status(StatusCode.ERROR, "interrupted")
            span.end()
            return ""
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
        if not self.member:
            return ""
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def tracing_from(option: bool | Tracing | None) -> Tracing | None:
    """The app option ``tracing=`` as a :class:`Tracing` (None when off)."""
    if option is None or option is False:
        return None
    if option is True:
        return Tracing()
    return option
