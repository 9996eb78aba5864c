"""Partition choice and validation of ``partitions=`` (no broker needed)."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

from tests.support import In, Out
from typedq import App, ConcurrencyLimit, ConfigError, Producer, RateLimit
from typedq.names import check_name, partition_queue, partition_queues
from typedq.settling import QueueRotation
from typedq.task import TaskDecorator, expand_queues


def test_the_partition_is_a_stable_hash_of_the_job_id() -> None:
    # Pinned values: the hash must not change across processes or versions, or a
    # re-sent enqueue would land in another partition and escape dedup.
    assert partition_queue("emails", 8, "a") == "emails.p7"
    assert partition_queue("emails", 8, "order:1") == "emails.p6"
    assert partition_queue("emails", 1, "a") == "emails"
    assert partition_queues("emails", 1) == ["emails"]
    assert partition_queues("emails", 3) == ["emails.p0", "emails.p1", "emails.p2"]
    for q in partition_queues("x" * 123, 256):
        check_name("queue", q)


def test_partitions_spread_ids_evenly() -> None:
    spread = Counter(partition_queue("q", 8, f"job-{i}") for i in range(8000))
    assert sorted(spread) == partition_queues("q", 8)
    assert min(spread.values()) > 800  # 1000 each on average


@pytest.mark.parametrize("bad", [0, 257, -1, True, 2.0, "8"])
def test_partitions_out_of_range_is_one_line(bad: object) -> None:
    app = App("parts")
    options: dict[str, Any] = {"partitions": bad}  # bad values on purpose, untyped
    with pytest.raises(ConfigError, match="partitions=") as err:

        @cast(TaskDecorator, app.task(queue="emails", **options))
        async def send(x: In) -> Out:
            return Out(x.n)

    assert "\n" not in str(err.value)


def test_tasks_of_one_queue_must_split_it_alike_and_partitions_are_reserved() -> None:
    app = App("parts")

    @app.task(queue="emails", partitions=4)
    async def a(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(ConfigError, match="same partitions="):

        @app.task(queue="emails", partitions=2)
        async def b(x: In) -> Out:
            return Out(x.n)

    with pytest.raises(ConfigError, match="is a partition of"):

        @app.task(queue="emails.p3")
        async def c(x: In) -> Out:
            return Out(x.n)

    @app.task(queue="emails", partitions=4)
    async def d(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="other")
    async def e(x: In) -> Out:
        return Out(x.n)

    assert app.queues == [*partition_queues("emails", 4), "other"]
    assert expand_queues(app.tasks.values(), ["other", "emails"]) == [
        "other",
        *partition_queues("emails", 4),
    ]
    assert d.queues == partition_queues("emails", 4)
    assert app.worker(queues=["emails"]).queues == partition_queues("emails", 4)


def test_producer_stubs_route_like_the_worker() -> None:
    app = App("parts")

    @app.task(queue="emails", partitions=8)
    async def send(x: In) -> Out:
        return Out(x.n)

    producer = Producer("parts")
    stub = producer.task("send", In, Out, queue="emails", partitions=8)
    for job_id in ("a", "b", "c", "send:k"):
        assert stub.message(In(1), job_id=job_id).queue == send.queue_for(job_id)
        assert send.message(In(1), job_id=job_id).queue == send.queue_for(job_id)


def test_claims_rotate_over_the_queues() -> None:
    rotation = QueueRotation(["a", "b", "c"])
    assert [rotation.next()[0] for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert rotation.next() == ["a", "b", "c"]
    assert QueueRotation(["x"]).next() == ["x"]


@pytest.mark.parametrize("limit", ["rate_limit", "concurrency"])
def test_a_limit_on_a_partitioned_task_is_refused_in_one_line(limit: str) -> None:
    """Issue 24 defect 1: the claim counts a limit per queue, and each partition is a
    queue (a shard of its own on Cluster): RateLimit(2, per=1) over 4 partitions let 8
    jobs start within 0.9 s on Redis, ConcurrencyLimit(1) let 4 run at once."""
    app = App("limits-partitions")
    given: dict[str, Any] = (
        {"rate_limit": RateLimit(2, per=1.0)}
        if limit == "rate_limit"
        else {"concurrency": ConcurrencyLimit(1)}
    )
    with pytest.raises(ConfigError) as info:

        @cast(TaskDecorator, app.task(partitions=4, **given))
        async def send(p: In) -> None: ...

    message = str(info.value)
    assert "\n" not in message
    assert f"task 'send': {limit}= cannot be combined with partitions=4" in message
    assert "drop partitions=" in message
    assert app.tasks == {}  # nothing of it registered
