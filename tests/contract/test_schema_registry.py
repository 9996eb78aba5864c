"""Broker contract, the schema registry (capability ``SchemaRegistry``, ``typedq
verify``): the first record of each ``(task, fingerprint)`` stays, stamped with the
broker's clock; apps and producers record their tasks' schemas once per process, at
connect.

Runs once per broker against the :class:`~typedq.broker.base.Broker` interface only.
"""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from tests.support import In, Out, connected
from typedq import App, Producer, Unsupported
from typedq.broker.base import Broker, BrokerSettings
from typedq.broker.capabilities import SchemaRegistry, supports
from typedq.broker.memory import MemoryBroker
from typedq.broker.schemas import SchemaRecord
from typedq.compat import decoding_schema
from typedq.serde import codec_for
from typedq.verify import verify

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


def record(task: str, fingerprint: str, schema: str = "{}") -> SchemaRecord:
    return SchemaRecord(task=task, fingerprint=fingerprint, input_schema=schema, output_schema="{}")


async def test_the_first_record_of_a_fingerprint_stays(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        assert supports(broker, SchemaRegistry)
        before = time.time()
        assert await broker.record_schemas([record("b", "f1", '{"a":1}'), record("a", "f0")]) == [
            True,
            True,
        ]
        again = await broker.record_schemas(
            [record("b", "f1", '{"a":2}'), record("b", "f2"), record("b", "f1")]
        )
        assert again == [False, True, False]
        assert await broker.record_schemas([]) == []
        records = await broker.schema_records()
        assert [(r.task, r.fingerprint) for r in records] == [("a", "f0"), ("b", "f1"), ("b", "f2")]
        kept = records[1]
        assert kept.input_schema == '{"a":1}'  # the first one stays
        assert before - 1 <= kept.first_seen <= time.time() + 1
        assert records[2].first_seen >= kept.first_seen
        assert await broker.forget_schemas([("b", "f1"), ("b", "nope"), ("c", "f1")]) == [
            True,
            False,
            False,
        ]
        assert [r.fingerprint for r in await broker.schema_records()] == ["f0", "f2"]
        assert await broker.forget_schemas([]) == []


async def test_an_app_records_its_tasks_once_per_process(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="q")
    async def double(payload: In) -> Out:
        return Out(payload.n * 2)

    async with app:
        (rec,) = await app.broker.schema_records()
        assert (rec.task, rec.fingerprint) == ("double", codec_for(In).fingerprint)
        assert json.loads(rec.input_schema) == decoding_schema(codec_for(In))
        assert json.loads(rec.output_schema) == decoding_schema(codec_for(Out))
    calls: list[int] = []
    original = type(app.broker).record_schemas

    async def counting(self: object, records: list[SchemaRecord]) -> list[bool]:
        calls.append(len(records))
        return await original(self, records)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(app.broker), "record_schemas", counting)
        async with app:
            pass  # connected again in this process: nothing new to record
    assert calls == []


class Renamed(msgspec.Struct, frozen=True):
    n: int
    note: str = ""


async def test_a_producer_records_its_stubs_and_a_new_model_adds_a_fingerprint(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    producer = Producer(app_name, broker=app.broker)
    producer.task("double", In, Out, queue="q")

    @app.task(queue="q")
    async def double(payload: In) -> Out:
        return Out(payload.n * 2)

    async with app, producer:
        records = await app.broker.schema_records()
    assert [(r.task, r.fingerprint) for r in records] == [("double", codec_for(In).fingerprint)]
    later = Producer(app_name, broker=app.broker)
    later.task("double", Renamed, Out, queue="q")
    async with later:
        records = await later.broker.schema_records()
    assert {r.fingerprint for r in records} == {
        codec_for(In).fingerprint,
        codec_for(Renamed).fingerprint,
    }


class NoRegistry(MemoryBroker):
    """An embedded broker that keeps the registry's Unsupported defaults."""

    record_schemas = Broker.record_schemas
    schema_records = Broker.schema_records
    forget_schemas = Broker.forget_schemas


async def test_a_broker_without_a_registry_is_skipped_at_connect_and_refuses_verify() -> None:
    broker = NoRegistry(BrokerSettings(namespace="bare"))
    assert not supports(broker, SchemaRegistry)
    app = App("bare", broker=broker)

    @app.task(queue="q")
    async def double(payload: In) -> Out:
        return Out(payload.n * 2)

    async with app:  # connects: nothing to record on, nothing raised
        with pytest.raises(Unsupported, match="does not support a schema registry"):
            await verify(app, broker)
