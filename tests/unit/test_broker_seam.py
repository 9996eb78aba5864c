"""The broker seam (typedq.broker.base, typedq.broker.capabilities): the core store, the
capability protocols, the check at connect, and the suite's fault-injecting fake.

Unit tests: no server is needed (RedisBroker is checked as a class).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, cast

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE, FaultyBroker, broker_methods
from typedq import App, BrokerError, JobContext, RateLimit, Unsupported
from typedq.broker.base import Broker, BrokerSettings, JobState
from typedq.broker.capabilities import (
    CAPABILITIES,
    CORE,
    CORE_WITH_DEFAULTS,
    Flows,
    Limits,
    Schedules,
    TransactionalEnqueue,
    capabilities_of,
    members,
    supports,
)
from typedq.broker.memory import MemoryBroker
from typedq.broker.postgres import PostgresBroker
from typedq.broker.redis import RedisBroker

pytestmark = pytest.mark.anyio

BACKENDS = [MemoryBroker, RedisBroker, PostgresBroker]

#: The capabilities a backend does not have (it keeps Broker's Unsupported defaults):
#: jobs stored in the caller's database transaction need a broker in that database. The
#: PostgreSQL broker has every capability (flow views and fair shares since migration 10;
#: docs/brokers.md).
LACKING: dict[type[Broker], tuple[type[Any], ...]] = {
    MemoryBroker: (TransactionalEnqueue,),
    RedisBroker: (TransactionalEnqueue,),
}


def _shape(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A method's parameters as (name, kind, default): what a caller relies on."""
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.kind, p.default) for p in params]


# -- the seam itself ------------------------------------------------------------------


def test_every_interface_method_is_core_or_of_one_capability() -> None:
    placed = [*CORE, *CORE_WITH_DEFAULTS, *(m for cap in CAPABILITIES for m in members(cap))]
    assert len(placed) == len(set(placed)), "a method is placed twice"
    assert sorted(placed) == broker_methods()
    assert sorted(Broker.__abstractmethods__) == sorted(CORE)
    assert len(CORE) == 14


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.__name__)
def test_a_capability_protocol_states_broker_signatures(capability: type[Any]) -> None:
    for name in members(capability):
        assert _shape(getattr(capability, name)) == _shape(getattr(Broker, name)), name


def test_the_bare_interface_has_no_capability() -> None:
    assert capabilities_of(Broker) == ()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
def test_a_backend_implements_the_core_and_every_capability(backend: type[Broker]) -> None:
    assert not inspect.isabstract(backend), sorted(backend.__abstractmethods__)
    lacking = LACKING.get(backend, ())
    has = tuple(cap for cap in CAPABILITIES if cap not in lacking)
    assert capabilities_of(backend) == has
    for capability in has:
        assert issubclass(backend, capability)
        assert supports(backend, capability)
    for capability in lacking:
        assert not supports(backend, capability)
    for name in [*CORE, *(m for cap in has for m in members(cap))]:
        method = getattr(backend, name)
        assert method is not getattr(Broker, name), f"{backend.__name__} lacks {name}"
        assert _shape(method) == _shape(getattr(Broker, name)), name


# -- a backend with only the core -------------------------------------------------------
#
# CoreOnly and FaultyBroker get their methods generated after the class statement, which
# mypy does not see: instantiating them needs `type: ignore[abstract]`.


def _core_forward(name: str) -> Callable[..., Any]:
    async def forward(self: CoreOnly, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.inner, name)(*args, **kwargs)

    forward.__name__ = name
    return forward


class CoreOnly(Broker):
    """The 14 core methods of an embedded broker, and nothing else: the smallest
    backend (every default of Broker's stays)."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.inner = MemoryBroker(settings)
        self.connects = 0

    async def connect(self) -> None:
        self.connects += 1
        await self.inner.connect()


for _name in CORE:
    if _name not in vars(CoreOnly):
        setattr(CoreOnly, _name, _core_forward(_name))
CoreOnly.__abstractmethods__ = frozenset()


def core_only(namespace: str = "typedq") -> CoreOnly:
    """A fresh CoreOnly broker."""
    return CoreOnly(BrokerSettings(namespace=namespace))  # type: ignore[abstract]


class Num(msgspec.Struct):
    n: int


async def test_an_app_runs_on_a_core_only_broker() -> None:
    broker = core_only("core")
    assert capabilities_of(broker) == ()
    app = App("core", broker=broker)

    @app.task
    async def double(x: Num) -> Num:
        return Num(2 * x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await double.enqueue(Num(21))
            assert await job.result(timeout=10) == Num(42)
            assert (await broker.counts("default"))[JobState.COMPLETED] == 1


@pytest.mark.parametrize(
    "method",
    [
        "broker_time_us",
        "list_workers",
        "list_queues",
        "schedule_states",
        "enable_events",
        "retry",
        "purge",
        "enqueue_flows",
        "get_runs",
        "append_streams",
    ],
)
async def test_a_missing_capability_raises_unsupported(method: str) -> None:
    broker = core_only("core")
    args: dict[str, list[Any]] = {"enable_events": ["q"], "retry": [["x"]], "purge": ["q", []]}
    args["enqueue_flows"] = [[]]
    args["get_runs"] = [["run-1"]]
    args["append_streams"] = [[]]
    with pytest.raises(Unsupported, match="CoreOnly does not support") as caught:
        await getattr(broker, method)(*args.get(method, []))
    # One error for "this backend cannot do that", caught as either of its bases.
    assert isinstance(caught.value, BrokerError)
    assert isinstance(caught.value, NotImplementedError)


async def test_a_broker_without_flows_answers_no_flow_state() -> None:
    assert not supports(CoreOnly, Flows)
    assert await core_only().flow_state("x") is None


async def test_an_app_declaring_what_the_broker_lacks_fails_at_connect() -> None:
    broker = core_only("lacks")
    app = App("lacks", broker=broker, event_streams=True)

    @app.task(rate_limit=RateLimit(10, per=1.0))
    async def send(x: Num) -> None:
        pass

    @app.task(emits=Num)
    async def speak(x: Num, ctx: JobContext[Num]) -> None:
        await ctx.emit(x)

    app.schedule(send, Num(1), every=60, name="tick")
    with pytest.raises(Unsupported) as caught:
        async with app:
            pass
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("broker CoreOnly lacks what app 'lacks' uses: ")
    for part in ("Schedules (schedules tick)", "Limits (rate_limit/concurrency of tasks send)"):
        assert part in message
    assert "EventStreams (App(event_streams=True))" in message
    assert "JobStreams (emits= of tasks speak)" in message
    assert broker.connects == 0, "the check comes before connecting"
    assert not app.client.connected


async def test_an_app_without_those_declarations_connects_to_it() -> None:
    assert not supports(CoreOnly, Schedules)
    assert not supports(CoreOnly, Limits)
    app = App("plain", broker=core_only("plain"))
    async with app:
        assert app.client.connected


# -- the fault-injecting fake forwards the whole interface -------------------------------


class _Recorder:
    """Stands in for a broker: every interface method records its call and answers a
    fresh object, so a forward is seen with its arguments and its answer."""

    def __init__(self) -> None:
        self.settings = BrokerSettings()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any], object]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in broker_methods():
            raise AttributeError(name)

        def record(*args: Any, **kwargs: Any) -> object:
            answer = object()
            self.calls.append((name, args, kwargs, answer))
            return answer

        if not inspect.iscoroutinefunction(getattr(Broker, name)):
            return record

        async def record_async(*args: Any, **kwargs: Any) -> object:
            return record(*args, **kwargs)

        return record_async


def _arguments(name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Distinct stand-in arguments for every parameter of ``Broker.<name>``."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for param in list(inspect.signature(getattr(Broker, name)).parameters.values())[1:]:
        value = f"<{param.name}>"
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[param.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


@pytest.mark.parametrize("name", broker_methods())
async def test_the_fake_broker_forwards_every_interface_method(name: str) -> None:
    inner = _Recorder()
    fake = FaultyBroker(cast(Broker, inner))  # type: ignore[abstract]
    args, kwargs = _arguments(name)
    method = getattr(fake, name)
    answer = (
        await method(*args, **kwargs)
        if inspect.iscoroutinefunction(method)
        else method(*args, **kwargs)
    )
    if name == "complete_and_claim":
        # The fake's complete then its claim, so their fault points apply to a refill.
        (c_name, c_args, _, c_answer), (l_name, l_args, l_kwargs, l_answer) = inner.calls
        assert (c_name, c_args) == ("complete", args[:1])
        assert (l_name, l_args) == ("claim", args[1:])
        assert l_kwargs == kwargs
        assert answer == (c_answer, l_answer)
        return
    assert [(n, a, k) for n, a, k, _ in inner.calls] == [(name, args, kwargs)]
    if name != "close":  # the fake's close lets held renewals go, and answers None
        assert answer is inner.calls[0][3]


async def test_the_fake_still_injects_its_faults() -> None:
    fake = FaultyBroker(MemoryBroker(BrokerSettings()))  # type: ignore[abstract]
    fake.inject("claim")
    await fake.connect()
    try:
        with pytest.raises(BrokerError, match="injected fault"):
            await fake.claim(["q"], 1, worker_id="w", lease=30.0)
        assert await fake.claim(["q"], 1, worker_id="w", lease=30.0) == []
        assert await fake.list_jobs("q", JobState.WAITING) == []  # forwarded, not None
    finally:
        await fake.close()
