"""OpenTelemetry traces on both brokers, with the SDK and an in-memory span exporter.

Span names, kinds and attributes per the messaging semantic conventions; the process
span a child of the producer's send span (in process, and across processes through a
real ``typedq worker`` on Redis); a chain and a fan-out with its callback as one trace;
``enqueue_many`` as one send span; nothing at all when tracing is off.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import msgspec
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, StatusCode

from tests import trace_app
from tests.cli_process import TypedqProcess
from tests.redis_harness import RedisProcess, flushall
from tests.support import TEST_DEADLINE, In, Out
from typedq import (
    App,
    Backoff,
    ConfigError,
    Failed,
    Fair,
    JobContext,
    JobFailed,
    Ok,
    Producer,
    QueueFull,
)
from typedq.broker.base import ClaimedJob, JobMessage
from typedq.broker.redis.codec import decode_job, encode, encode_body
from typedq.outcomes import Complete
from typedq.tracing import Tracing, decode_carrier, encode_carrier

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider)


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


async def _finished(exporter: InMemorySpanExporter, count: int) -> tuple[ReadableSpan, ...]:
    """The spans once ``count`` process spans ended (a result is visible to the producer
    a moment before its worker ended the span)."""
    with anyio.fail_after(TEST_DEADLINE):
        while True:
            spans = exporter.get_finished_spans()
            if sum(s.name.startswith("process ") for s in spans) >= count:
                return spans
            await anyio.sleep(0.01)


async def test_send_and_process_spans(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)
    inner = tracing.tracer

    @app.task(queue="mail")
    async def echo(x: In) -> Out:
        with inner.start_as_current_span("handler work"):
            return Out(x.n)

    async with app, app.worker(concurrency=2):
        job = await echo.enqueue(In(n=3))
        assert await job.result(timeout=TEST_DEADLINE) == Out(3)
        spans = await _finished(exporter, 1)
    [send] = _by_name(spans, "send mail")
    [process] = _by_name(spans, "process mail")
    [work] = _by_name(spans, "handler work")
    assert send.kind is SpanKind.PRODUCER
    assert process.kind is SpanKind.CONSUMER
    assert dict(send.attributes or {}) == {
        "messaging.system": "typedq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "mail",
        "messaging.message.id": job.id,
        "typedq.task": "echo",
    }
    assert dict(process.attributes or {}) == {
        "messaging.system": "typedq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": job.id,
        "typedq.task": "echo",
        "typedq.attempt": 1,
        "typedq.outcome": "completed",
    }
    trace_id, send_id = _ids(send)
    assert _ids(process)[0] == trace_id
    assert _parent_id(process) == send_id
    assert _ids(work)[0] == trace_id
    assert _parent_id(work) == _ids(process)[1]
    assert process.status.status_code is StatusCode.UNSET


async def test_a_sync_handler_runs_in_its_process_span(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)
    inner = tracing.tracer

    @app.task
    def blocking(x: In) -> Out:
        with inner.start_as_current_span("in a thread"):
            return Out(x.n)

    async with app, app.worker(concurrency=1):
        job = await blocking.enqueue(In(n=1))
        await job.result(timeout=TEST_DEADLINE)
        spans = await _finished(exporter, 1)
    [process] = _by_name(spans, "process default")
    [work] = _by_name(spans, "in a thread")
    assert _parent_id(work) == _ids(process)[1]


async def test_a_failed_attempt_is_an_error_with_its_exception(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0))
    async def broken(x: In) -> Out:
        raise ValueError(f"broken {x.n}")

    async with app, app.worker(concurrency=1):
        job = await broken.enqueue(In(n=4))
        with pytest.raises(JobFailed):
            await job.result(timeout=TEST_DEADLINE)
        spans = await _finished(exporter, 2)
    [send] = _by_name(spans, "send default")
    processes = sorted(
        _by_name(spans, "process default"),
        key=lambda s: str((s.attributes or {})["typedq.attempt"]),
    )
    assert [(s.attributes or {})["typedq.outcome"] for s in processes] == ["retried", "failed"]
    for span in processes:
        assert _parent_id(span) == _ids(send)[1]
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: broken 4"
        [event] = span.events
        assert event.name == "exception"
        attributes = dict(event.attributes or {})
        assert attributes["exception.type"] == "ValueError"
        assert attributes["exception.message"] == "broken 4"
        assert "raise ValueError" in str(attributes["exception.stacktrace"])


async def test_a_chain_of_three_steps_is_one_trace(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task
    async def parse(x: In) -> In:
        return In(x.n + 1)

    @app.task
    async def enrich(x: In) -> In:
        return In(x.n * 10)

    @app.task
    async def store(x: In) -> Out:
        return Out(x.n)

    async with app, app.worker(concurrency=2):
        job = await parse.then(enrich).then(store).enqueue(In(n=1))
        assert await job.result(timeout=TEST_DEADLINE) == Out(20)
        spans = await _finished(exporter, 3)
    [send] = _by_name(spans, "send default")
    assert (send.attributes or {})["messaging.message.id"] == job.id
    assert (send.attributes or {})["messaging.batch.message_count"] == 3
    processes = _by_name(spans, "process default")
    assert sorted(str((s.attributes or {})["typedq.task"]) for s in processes) == [
        "enrich",
        "parse",
        "store",
    ]
    trace_id, send_id = _ids(send)
    for span in processes:
        assert _ids(span)[0] == trace_id
        assert _parent_id(span) == send_id


async def test_a_fan_out_and_its_callback_are_one_trace(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n * x.n)

    @app.task
    async def total(xs: list[Out]) -> Out:
        return Out(sum(x.n for x in xs))

    async with app, app.worker(concurrency=4):
        job = await square.map(In(n=i) for i in range(4)).then(total).enqueue()
        assert await job.result(timeout=TEST_DEADLINE) == Out(14)
        spans = await _finished(exporter, 5)
    [send] = _by_name(spans, "send default")
    trace_id, send_id = _ids(send)
    processes = _by_name(spans, "process default")
    assert sorted(str((s.attributes or {})["typedq.task"]) for s in processes) == [
        *["square"] * 4,
        "total",
    ]
    assert {(_ids(s)[0], _parent_id(s)) for s in processes} == {(trace_id, send_id)}


async def test_a_fan_in_of_fair_members_links_to_their_process_spans(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """Fair members (typedq.fair): the callback links to each member's process span, as
    for plain members. (A held callback is a plain job at the app level, see
    typedq/workflow.py; a fair callback's body: tests/contract/test_fair.py.)"""
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task(fair=Fair(key=lambda x: x.n % 2))
    async def square(x: In) -> Out:
        return Out(x.n * x.n)

    @app.task
    async def total(xs: list[Out]) -> Out:
        return Out(sum(x.n for x in xs))

    async with app, app.worker(concurrency=1):
        job = await square.map(In(n=i) for i in range(1, 4)).then(total).enqueue()
        assert await job.result(timeout=TEST_DEADLINE) == Out(14)
        spans = await _finished(exporter, 4)
    processes = _by_name(spans, "process default")
    members = sorted(
        (s for s in processes if (s.attributes or {})["typedq.task"] == "square"),
        key=lambda s: str((s.attributes or {})["messaging.message.id"]),
    )
    [callback] = [s for s in processes if (s.attributes or {})["typedq.task"] == "total"]
    assert [(link.context.trace_id, link.context.span_id) for link in callback.links] == [
        _ids(m) for m in members
    ]


async def test_a_fan_in_callback_links_to_its_members_process_spans(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n * x.n)

    @app.task
    async def total(xs: list[Out]) -> Out:
        return Out(sum(x.n for x in xs))

    @app.task
    async def double(x: Out) -> Out:
        return Out(x.n * 2)

    async with app, app.worker(concurrency=4):
        job = await square.map(In(n=i) for i in range(1, 4)).then(total).then(double).enqueue()
        assert await job.result(timeout=TEST_DEADLINE) == Out(28)
        spans = await _finished(exporter, 5)
    processes = _by_name(spans, "process default")
    by_task: dict[str, list[ReadableSpan]] = {}
    for span in processes:
        by_task.setdefault(str((span.attributes or {})["typedq.task"]), []).append(span)
    members = sorted(
        by_task["square"], key=lambda s: str((s.attributes or {})["messaging.message.id"])
    )
    [callback] = by_task["total"]
    [after] = by_task["double"]
    # Exactly one link per member, to its process span, in member order.
    assert [(link.context.trace_id, link.context.span_id) for link in callback.links] == [
        _ids(m) for m in members
    ]
    assert all(
        link.context.is_remote and link.context.trace_flags.sampled for link in callback.links
    )
    # Still a child of the flow's send span, like every job of the flow; the step after
    # the callback links to nothing.
    [send] = _by_name(spans, "send default")
    assert _parent_id(callback) == _ids(send)[1]
    assert list(after.links) == []
    assert all(list(m.links) == [] for m in members)


async def test_a_collecting_fan_in_links_to_failed_members_too(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0))
    async def check(x: In) -> Out:
        if x.n == 2:
            raise ValueError("two")
        return Out(x.n)

    @app.task
    async def report(xs: list[Ok[Out] | Failed]) -> Out:
        return Out(sum(isinstance(x, Ok) for x in xs))

    async with app, app.worker(concurrency=4):
        job = await check.map(In(n=i) for i in range(1, 4)).collect(report).enqueue()
        assert await job.result(timeout=TEST_DEADLINE) == Out(2)
        spans = await _finished(exporter, 5)  # 3 members, a retry, the callback
    processes = _by_name(spans, "process default")
    [callback] = [s for s in processes if (s.attributes or {})["typedq.task"] == "report"]
    # The member that failed twice: its final attempt's span (not its retried one's).
    settled = {}
    for span in processes:
        attributes = span.attributes or {}
        if attributes["typedq.task"] == "check" and attributes["typedq.outcome"] != "retried":
            settled[str(attributes["messaging.message.id"])] = _ids(span)
    assert len(settled) == 3
    assert [(link.context.trace_id, link.context.span_id) for link in callback.links] == [
        settled[k] for k in sorted(settled)
    ]


async def test_enqueue_many_is_one_send_span(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing)

    @app.task(queue="bulk")
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app, app.worker(concurrency=4):
        jobs = await echo.enqueue_many(In(n=i) for i in range(25))
        for job in jobs:
            await job.result(timeout=TEST_DEADLINE)
        spans = await _finished(exporter, 25)
    [send] = [s for s in spans if s.name.startswith("send")]
    assert send.name == "send bulk"
    assert (send.attributes or {})["messaging.batch.message_count"] == 25
    assert "messaging.message.id" not in (send.attributes or {})
    processes = _by_name(spans, "process bulk")
    assert sorted(str((s.attributes or {})["messaging.message.id"]) for s in processes) == sorted(
        j.id for j in jobs
    )
    assert {_parent_id(s) for s in processes} == {_ids(send)[1]}


async def test_a_refused_enqueue_is_an_error_send_span(
    app_name: str, broker_url: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url, tracing=tracing, max_queue_length=1)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app:
        await echo.enqueue(In(n=1))
        with pytest.raises(QueueFull):
            await echo.enqueue(In(n=2))
    ok, refused = exporter.get_finished_spans()
    assert ok.status.status_code is StatusCode.UNSET
    assert refused.status.status_code is StatusCode.ERROR
    assert [e.name for e in refused.events] == ["exception"]
    assert str((refused.events[0].attributes or {})["exception.type"]).endswith("QueueFull")


async def test_no_span_and_no_context_when_tracing_is_off(
    app_name: str, broker_url: str, exporter: InMemorySpanExporter
) -> None:
    app = App(app_name, broker=broker_url)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    seen: list[str] = []

    @app.task
    async def echo(x: In, ctx: JobContext) -> Out:
        seen.append(repr(trace.get_current_span().get_span_context().span_id))
        return Out(x.n)

    assert app.client.tracing is None
    async with app, app.worker(concurrency=1):
        with tracer.start_as_current_span("caller"):
            job = await echo.enqueue(In(n=1))
        await job.result(timeout=TEST_DEADLINE)
        [record] = await app.broker.get([job.id])
    assert [s.name for s in exporter.get_finished_spans()] == ["caller"]
    assert seen == ["0"]  # no current span in the handler
    assert record is not None
    assert record.message.trace_context == ""


def test_tracing_without_the_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "typedq.tracing", None)
    with pytest.raises(ConfigError, match=r"pip install 'typedq\[otel\]'"):
        App("noextra", tracing=True)
    assert App("noextra").client.tracing is None


def test_the_carrier_survives_the_envelope() -> None:
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": "a=b,c=d"}
    assert decode_carrier(encode_carrier(carrier)) == carrier
    message = JobMessage(
        id="j1", task="t", queue="q", payload=b"\x90", trace_context=encode_carrier(carrier)
    )
    assert decode_job("j1", "q", encode_body(message)) == message
    # A body written before the field existed (11 fields) reads with no context.
    old = encode(["t", b"\x90", "fp", 0, -1, -1.0, 0.0, 0.0, "rk", "ck", 5.0])
    assert decode_job("j1", "q", old).trace_context == ""
    assert msgspec.msgpack.decode(encode_body(message))[-1] == message.trace_context
    # A fan-in callback's links to its members' spans: the 13th field (the fan-in script
    # appends it to a 12-field body), read back; bodies without it have none.
    assert len(msgspec.msgpack.decode(encode_body(message))) == 12
    links = ",".join(f"00-{'1' * 32}-{i:016x}-01" for i in (1, 2))
    linked = msgspec.structs.replace(message, trace_links=links)
    assert msgspec.msgpack.decode(encode_body(linked))[-1] == links
    assert decode_job("j1", "q", encode_body(linked)) == linked
    assert decode_job("j1", "q", encode_body(message)).trace_links == ""


@pytest.mark.parametrize(
    "carried",
    [
        "traceparent=00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        "traceparent=00-" + "a" * 32 + "-" + "b" * 16 + "-00",
        "traceparent=00-" + "0" * 32 + "-" + "2" * 16 + "-01",  # invalid: no parent
        "traceparent=01-" + "1" * 32 + "-" + "2" * 16 + "-01",  # another version
        "traceparent=00-" + "1" * 32 + "-" + "2" * 16 + "-01\ntracestate=a=b",
        "traceparent=00-" + "1" * 32 + "-" + "2" * 16 + "-01\nbaggage=k=v",
    ],
)
def test_a_process_span_has_the_parent_the_propagator_extracts(carried: str) -> None:
    """The lone-traceparent shortcut gives the parent the global propagator gives."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    claimed = ClaimedJob(
        message=JobMessage(id="j1", task="t", queue="q", payload=b"", trace_context=carried),
        token="t",  # noqa: S106  # a lease token, not a password
        attempt=1,
        enqueued_at=time.time(),
    )
    for _ in range(2):  # the second one comes from the last-context cache
        traced = tracing.process(claimed)
        assert traced is not None
        traced.end(Complete(b"\xc0"))
    expected = trace.get_current_span(propagate.extract(decode_carrier(carried))).get_span_context()
    spans = exporter.get_finished_spans()
    if expected.is_valid and not expected.trace_flags.sampled:
        assert spans == ()  # the default sampler follows the parent: not recorded
    else:
        assert len(spans) == 2
    for span in spans:
        if expected.is_valid:
            assert span.parent == expected
            assert span.context is not None
            assert span.context.trace_id == expected.trace_id
        else:
            assert span.parent is None
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached again


def test_without_an_sdk_no_span_is_made_and_a_carried_context_passes_on() -> None:
    tracing = Tracing(trace.NoOpTracerProvider())
    parent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"

    def claimed(carried: str) -> ClaimedJob:
        message = JobMessage(id="j1", task="t", queue="q", payload=b"", trace_context=carried)
        return ClaimedJob(message=message, token="t", attempt=1, enqueued_at=time.time())  # noqa: S106

    assert tracing.process(claimed("")) is None  # nothing came with the job: nothing to do
    traced = tracing.process(claimed(f"traceparent={parent}"))
    assert traced is not None
    current = trace.get_current_span().get_span_context()
    assert (current.trace_id, current.span_id) == (int("1" * 32, 16), int("2" * 16, 16))
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    assert carrier["traceparent"] == parent  # an enqueue in the handler continues the trace
    traced.end(Complete(b"\xc0"))
    assert trace.get_current_span() is trace.INVALID_SPAN


@pytest.mark.parametrize("follows", [True, False])
def test_an_unsampled_producer_trace_makes_no_span_when_the_sampler_follows_it(
    follows: bool,
) -> None:
    """A job whose producer did not sample its trace, under the SDK's ParentBased sampler
    (which would make a non-recording span nothing sees): no span at all, the producer's
    context passed on. A sampler that records such spans gets its span."""
    exporter = InMemorySpanExporter()
    sampler = (
        ParentBased(ALWAYS_ON)
        if follows
        else ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON)
    )
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    parent = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    for carried in (f"traceparent={parent}", f"traceparent={parent}\ntracestate=a=b"):
        message = JobMessage(id="j1", task="t", queue="q", payload=b"", trace_context=carried)
        claimed = ClaimedJob(message=message, token="t", attempt=1, enqueued_at=time.time())  # noqa: S106
        traced = tracing.process(claimed)
        assert traced is not None
        assert traced.span.is_recording() is not follows
        current = trace.get_current_span().get_span_context()
        assert current.trace_id == int("1" * 32, 16)
        assert not current.trace_flags.sampled or not follows
        if follows:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            assert carrier["traceparent"] == parent  # an enqueue continues the trace, unsampled
        traced.end(Complete(b"\xc0"))
        assert trace.get_current_span() is trace.INVALID_SPAN
    assert len(exporter.get_finished_spans()) == (0 if follows else 2)


# -- across processes ------------------------------------------------------------------


@pytest.mark.redis
def test_a_worker_process_continues_the_producers_trace(
    redis_server: RedisProcess, tmp_path: Path, tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    flushall(redis_server.port)
    spans_file = tmp_path / "spans.jsonl"
    process = TypedqProcess(
        "worker",
        "tests.trace_app:app",
        "--broker",
        redis_server.url,
        env={trace_app.SPANS_ENV: str(spans_file)},
    )

    async def produce() -> str:
        producer = Producer(trace_app.app.name, broker=redis_server.url, tracing=tracing)
        echo = producer.task("echo", In, Out, queue="traced")
        async with producer:
            job = await echo.enqueue(In(n=8))
            assert await job.result(timeout=TEST_DEADLINE) == Out(8)
            return job.id

    try:
        process.wait_for("started")
        job_id = anyio.run(produce)
        deadline = time.monotonic() + TEST_DEADLINE
        while not spans_file.exists() or len(spans_file.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, "the worker wrote no spans"
            time.sleep(0.05)
    finally:
        process.close()
    [send] = exporter.get_finished_spans()
    assert send.name == "send traced"
    assert send.kind is SpanKind.PRODUCER
    remote = [json.loads(line) for line in spans_file.read_text().splitlines()]
    by_name = {s["name"]: s for s in remote}
    process_span, inner = by_name["process traced"], by_name["echo work"]
    trace_id, send_id = _ids(send)
    assert process_span["kind"] == "SpanKind.CONSUMER"
    assert process_span["context"]["trace_id"] == f"0x{trace_id:032x}"
    assert process_span["parent_id"] == f"0x{send_id:016x}"
    assert process_span["attributes"]["messaging.message.id"] == job_id
    assert inner["parent_id"] == process_span["context"]["span_id"]
