"""The bulk enqueue path's shortcuts give what the job-by-job path gives: envelopes made
from one template (``TaskBase._build_many``), payloads encoded in one loop
(``Codec.encode_many``), job bodies encoded without the field list (``encode_body``), and
Redis commands packed by hiredis (the connection mixin)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import pydantic
import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from tests.conftest import EACH_BROKER
from typedq import App, EncodeError, PayloadTooLarge
from typedq.broker.base import JobMessage
from typedq.broker.redis import codec
from typedq.broker.redis.connection import _LostSendIsConnectionError
from typedq.names import partition_queue
from typedq.serde import Codec, codec_for
from typedq.task import UNSET, TaskBase

pytestmark = pytest.mark.anyio


class Invoice(msgspec.Struct):
    invoice_id: int
    note: str = ""


class Note(pydantic.BaseModel):
    text: str


def _tasks(broker: str = "memory://") -> tuple[App, TaskBase[Any, Any], TaskBase[Any, Any]]:
    app = App("bulk-path", broker=broker, max_payload_bytes=64)

    @app.task(priority=3, retries=2)
    async def plain(invoice: Invoice) -> None:
        pass

    @app.task(queue="split", partitions=4)
    async def split(invoice: Invoice) -> None:
        pass

    return app, plain, split


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"priority": -2},
        {"delay": timedelta(seconds=5)},
        {"eta": datetime(2030, 1, 1, tzinfo=UTC)},
    ],
)
def test_envelopes_from_the_template_equal_the_job_by_job_ones(options: Any) -> None:
    _, plain, split = _tasks()
    payloads = [Invoice(i, note="n" * i) for i in range(20)]
    for task in (plain, split):
        checked = task._options(options, UNSET, UNSET)
        fast = task._build_many(iter(payloads), checked)  # any iterable, in order
        assert len(fast) == len(payloads)
        assert len({m.id for m in fast}) == len(fast)
        for m, payload in zip(fast, payloads, strict=True):
            slow = task._build(payload, m.id, checked)  # the same envelope, job by job
            assert m == slow
            assert m.queue == partition_queue(task.queue, task.options.partitions, m.id)


def test_encode_many_raises_what_encode_raises_for_the_first_bad_payload() -> None:
    codec: Codec[Any] = codec_for(Invoice, max_bytes=64)
    good = [Invoice(1), Invoice(2)]
    assert codec.encode_many(good) == [codec.encode(p) for p in good]
    assert codec.encode_many(iter(good)) == [codec.encode(p) for p in good]
    with pytest.raises(EncodeError, match="expected an instance of Invoice, got Note"):
        codec.encode_many([Invoice(1), Note(text="x"), Invoice(3, note="x" * 100)])
    with pytest.raises(PayloadTooLarge):
        codec.encode_many([Invoice(1), Invoice(3, note="x" * 100), Note(text="x")])
    with pytest.raises(EncodeError, match="cannot encode Invoice"):
        codec.encode_many([Invoice(1, note=object())])  # type: ignore[arg-type]
    pydantic_codec = codec_for(Note)
    notes = [Note(text="a"), Note(text="b")]
    assert pydantic_codec.encode_many(notes) == [pydantic_codec.encode(n) for n in notes]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("_broker_backend", EACH_BROKER, indirect=True)
async def test_a_bad_payload_in_a_bulk_enqueue_sends_nothing(broker_url: str) -> None:
    app, plain, split = _tasks(broker_url)
    async with app:
        for task in (plain, split):
            with pytest.raises(PayloadTooLarge):
                await task.enqueue_many([Invoice(1), Invoice(2, note="x" * 100)])
        jobs = await split.enqueue_many([Invoice(i) for i in range(8)])
        assert [j.queue for j in jobs] == [split.queue_for(j.id) for j in jobs]
        assert all(j.created for j in jobs)
        # Sent again (a retried call): the same ids store nothing twice.
        again = await app.client.enqueue_many(
            [split.message(Invoice(i), job_id=j.id) for i, j in enumerate(jobs)]
        )
        assert [o.id for o in again] == [j.id for j in jobs]
        assert not any(o.created for o in again)
        counts = [await app.broker.counts(q) for q in (plain.queue, *split.queues)]
        assert sum(sum(c.values()) for c in counts) == 8


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("_broker_backend", EACH_BROKER, indirect=True)
async def test_concurrent_bulk_enqueues_make_distinct_jobs(broker_url: str) -> None:
    """Batches enqueued at once (their ids made per batch) never share an id, and each
    batch's jobs come back in input order, all stored; a batch sent again stores nothing."""
    app, plain, _ = _tasks(broker_url)
    async with app:
        batches = [[Invoice(b * 1000 + i) for i in range(150)] for b in range(6)]
        results: list[list[Any]] = [[] for _ in batches]

        async def send(b: int) -> None:
            results[b] = await plain.enqueue_many(batches[b])

        async with anyio.create_task_group() as tg:
            for b in range(len(batches)):
                tg.start_soon(send, b)
        ids = [job.id for jobs in results for job in jobs]
        assert len(set(ids)) == len(ids) == 900
        assert all(job.created for jobs in results for job in jobs)
        for jobs in results:
            assert [job.id for job in jobs] == sorted(job.id for job in jobs)
        again = await app.client.enqueue_many(
            [plain.message(Invoice(0), job_id=i) for i in ids[:300]]
        )
        assert not any(o.created for o in again)
        counts = await app.broker.counts(plain.queue)
        assert sum(counts.values()) == 900


def _reference_body(m: JobMessage) -> bytes:
    """The body as encode_body made it before its shortcut: all fields, trailing
    defaults trimmed."""
    fields = [m.task, m.payload, m.fingerprint, m.priority, m.max_retries, m.timeout, m.eta]
    fields += (m.delay, m.rate_key, m.concurrency_key, m.scheduled_for, m.trace_context)
    fields.append(m.trace_links)
    n = len(fields)
    while n > 2 and fields[n - 1] == codec._BODY_DEFAULTS[n - 1]:
        n -= 1
    return msgspec.msgpack.encode(fields[:n])


def test_encode_body_gives_the_bytes_of_the_whole_field_list() -> None:
    choices: dict[str, list[Any]] = {
        "fingerprint": ["", "0123456789abcdef"],
        "priority": [0, 3],
        "max_retries": [-1, 2],
        "timeout": [-1.0, 0.0],
        "eta": [0.0, 1.5],
        "delay": [0.0, 2.0],
        "rate_key": ["", "r"],
        "concurrency_key": ["", "c"],
        "scheduled_for": [0.0, 9.0],
        "trace_context": ["", "traceparent=00-x"],
        "trace_links": ["", "00-y"],
    }
    # Every field default or not, alone, and a few combinations of them.
    cases: list[dict[str, Any]] = [{}] + [{name: values[1]} for name, values in choices.items()]
    cases += [
        dict(zip(choices, combo, strict=True))
        for combo in itertools.islice(itertools.product(*choices.values()), 0, None, 97)
    ]
    for options in cases:
        m = JobMessage(id="j1", task="t", queue="q", payload=b"\x91\x01", **options)
        body = codec.encode_body(m)
        assert body == _reference_body(m), options
        assert codec.decode_job("j1", "q", body) == m


def _connection() -> Connection:
    cls = type("Packing", (_LostSendIsConnectionError, Connection), {})
    return cls()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "args",
    [
        ("SET", "k", 1.5),
        ("SET", "k", 2**70),
        ("SET", "k", "é"),
        ("SET", "k", b"\x00\xff"),
        ("SET", "k", memoryview(b"ab")),
        ("SET", "k", bytearray(b"ab")),  # not taken by hiredis: redis-py packs it
        ("CONFIG GET", "maxmemory"),  # a two-word command name is split, as redis-py does
        ("FCALL", "f", 2, "a", "b", *["x"] * 600, 0, -1),
    ],
)
def test_commands_are_packed_as_redis_py_packs_them(args: tuple[Any, ...]) -> None:
    packed = _connection().pack_command(*args)
    assert b"".join(packed) == b"".join(Connection().pack_command(*args))


def test_values_redis_py_refuses_are_still_refused() -> None:
    bad: Any
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            _connection().pack_command("SET", "k", bad)


def test_a_pipeline_is_packed_command_by_command() -> None:
    commands = [("PING",), ("GET", "a"), ("SET", "k", bytearray(b"v"))]
    assert b"".join(_connection().pack_commands(commands)) == b"".join(
        Connection().pack_commands(commands)
    )
