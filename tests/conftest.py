"""Shared fixtures: anyio backends, a session redis-server, and an App per broker.

Brokers are parametrized: every test that takes ``broker_url`` runs on the embedded
broker (under asyncio and trio), on a real redis-server and on a real local Redis
Cluster (asyncio only: redis-py is asyncio-based; marker ``cluster``). A fresh app name per test keeps tests apart on the shared server.

Tests that drive redis-py (asyncio-based) are marked ``asyncio_only``; the Redis-only
files take ``redis_url`` (the session redis-server, flushed).

Files marked ``core_store`` (their tests use the seam's core alone) also run on the
brokers that so far have only the core (CORE_BACKENDS: the PostgreSQL broker, on a
throwaway cluster started once per session, ``pg_cluster``).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.pg_harness import PgCluster, pg_missing
from tests.redis_harness import REDIS_SERVER, RedisCluster, RedisProcess, flushall
from tests.xdist_units import make_scheduler, order_items
from typedq.errors import Unsupported

_names = itertools.count()


class _UnitsOfWork:
    """pytest-xdist's hook (registered when pytest-xdist is loaded: ``-p no:xdist``
    leaves its hooks undeclared)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """``--dist loadfile`` splits the files of tests/xdist_units.py's SPLIT into units
        of work of a test (or a group of tests) each."""
        return make_scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadfile``, units of work (tests/xdist_units.py) are handed out in
    the order collected (pytest_collection_modifyitems), not pytest-xdist's default of
    the most tests first, which put the long fault files (few tests each) last."""
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(_UnitsOfWork(), "typedq-units-of-work")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Units of work in the order they should start (under ``--dist loadfile``, longest
    first keeps the end of the run balanced): tests/xdist_units.py's order_items."""
    order_items(items)


def _unsupported_only(exc: BaseException) -> Unsupported | None:
    """``exc`` if it is Unsupported, or the first of an exception group holding nothing else."""
    if isinstance(exc, Unsupported):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [_unsupported_only(e) for e in exc.exceptions]
        if found and all(f is not None for f in found):
            return found[0]
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Captured output as valid UTF-8: a test may log a lone surrogate (a handler's
    exception message), and pytest-xdist cannot send such a string between processes.

    A test of a ``core_store`` file run on a core-only broker (CORE_BACKENDS: the
    PostgreSQL broker) that reaches a capability the broker lacks yet (it raised
    Unsupported, and nothing else) is reported as xfailed, with the capability named: the
    part of the test before it ran and passed; once the broker has the capability, the test
    passes on it."""
    report = yield
    callspec = getattr(item, "callspec", None)
    if (
        call.excinfo is not None
        and report.failed
        and callspec is not None
        and callspec.params.get("_broker_backend", ("",))[0] in _CORE_ONLY
        and (unsupported := _unsupported_only(call.excinfo.value)) is not None
    ):
        report.outcome = "skipped"
        report.wasxfail = f"core-only broker lacks a capability yet: {unsupported}"
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
    return report


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """One redis-server for the whole session, on a free port (not the machine's :6379)."""
    if REDIS_SERVER is None:
        pytest.fail("redis-server is not installed; `make test` installs it (apt-get)")
    server = RedisProcess()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL cluster for the whole session (initdb + pg_ctl in a temp
    dir, on a free port; never the machine's service), stopped at the end."""
    missing = pg_missing()
    if missing is not None:
        pytest.skip(f"no throwaway PostgreSQL cluster: {missing}")
    cluster = PgCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One local Redis Cluster (3 primaries, 3 replicas) for the whole session."""
    if REDIS_SERVER is None:
        pytest.fail("redis-server is not installed; `make test` installs it (apt-get)")
    cluster = RedisCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


#: The ``anyio_backend`` param of a broker-parametrized test: the backend its broker runs on.
_BROKERS_BACKEND = "the broker's"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Broker-independent async tests run under both anyio backends (``asyncio_only``
    ones under asyncio alone); a test that takes ``broker_url`` runs under its broker's
    backend (pytest_generate_tests below)."""
    if request.param == _BROKERS_BACKEND:
        backend: str = request.getfixturevalue("broker_backend_name")
        return backend
    backend = request.param
    return backend


def _parametrizes(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if name in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Which anyio backends an async test runs under, when it does not say itself.

    - marked ``asyncio_only`` (redis-py is asyncio-based): asyncio alone;
    - taking ``broker_url`` (``_broker_backend``): its broker's backend (the embedded
      broker under asyncio and trio, Redis and Cluster under asyncio), not every backend
      with every broker.

    Each becomes a parametrization of ``anyio_backend`` (direct for asyncio_only,
    indirect through the fixture for a broker's), which pytest prefers to the fixture's
    params when it finds it among the test's ``parametrize`` marks; added here, before
    pytest's own hooks read those marks (tryfirst). Its id is hidden: the test ids name
    the backend once, in the broker's id (``memory-trio``).
    """
    if (
        "_broker_backend" in metafunc.fixturenames
        and metafunc.definition.get_closest_marker("core_store")
        and not _parametrizes(metafunc, "_broker_backend")
    ):
        # A file of core-store tests: every broker, the core-only ones too.
        metafunc.definition.add_marker(
            pytest.mark.parametrize("_broker_backend", CORE_BACKENDS, indirect=True)
        )
    if "anyio_backend" not in metafunc.fixturenames or _parametrizes(metafunc, "anyio_backend"):
        return
    if metafunc.definition.get_closest_marker("asyncio_only"):
        metafunc.definition.add_marker(
            pytest.mark.parametrize("anyio_backend", ["asyncio"], ids=[pytest.HIDDEN_PARAM])
        )
    elif "_broker_backend" in metafunc.fixturenames:
        metafunc.definition.add_marker(
            pytest.mark.parametrize(
                "anyio_backend", [_BROKERS_BACKEND], indirect=True, ids=[pytest.HIDDEN_PARAM]
            )
        )


BACKENDS = [
    pytest.param(("memory", "asyncio"), id="memory-asyncio"),
    pytest.param(("memory", "trio"), id="memory-trio"),
    pytest.param(("redis", "asyncio"), id="redis-asyncio", marks=pytest.mark.redis),
    pytest.param(
        ("cluster", "asyncio"),
        id="cluster-asyncio",
        marks=[pytest.mark.redis, pytest.mark.cluster],
    ),
]
#: Each broker once (the embedded one under asyncio): for broker-level tests whose runs on
#: the embedded broker are the same under trio and asyncio (it is deterministic and they
#: drive it step by step), with ``@pytest.mark.parametrize("_broker_backend", EACH_BROKER,
#: indirect=True)``. Trio keeps its runs in the contract suite and the runtime tests.
EACH_BROKER = [BACKENDS[0], BACKENDS[2]]
#: Every broker, and the brokers that so far have only the core store of the seam (the
#: PostgreSQL broker, issue 30): for the files marked ``core_store`` (``pytestmark``),
#: whose tests use the core alone. A capability's tests stay on BACKENDS until the
#: backend has it.
_CORE_ONLY = frozenset({"postgres"})
CORE_BACKENDS = [
    *BACKENDS,
    pytest.param(("postgres", "asyncio"), id="postgres-asyncio", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def _broker_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    param: tuple[str, str] = request.param
    return param


@pytest.fixture
def broker_backend_name(_broker_backend: tuple[str, str]) -> str:
    """The anyio backend of a broker-parametrized test; contract conftests use it."""
    return _broker_backend[1]


@pytest.fixture
def broker_url(_broker_backend: tuple[str, str], request: pytest.FixtureRequest) -> str:
    """``memory://``, the session redis-server's URL or the session Redis Cluster's
    (flushed before the test)."""
    kind = _broker_backend[0]
    if kind == "memory":
        return "memory://"
    if kind == "postgres":
        # One schema for the session: tests are kept apart by their fresh app names.
        pg: PgCluster = request.getfixturevalue("pg_cluster")
        return pg.url
    if kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        cluster.flushall()
        return cluster.url
    server: RedisProcess = request.getfixturevalue("redis_server")
    flushall(server.port)
    return server.url


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """The session redis-server's URL, flushed before the test."""
    flushall(redis_server.port)
    return redis_server.url


@pytest.fixture
async def ledger(redis_server: RedisProcess) -> AsyncIterator[aioredis.Redis]:
    """Where worker processes' handlers record their runs: database 1 of the session
    redis-server, flushed first (``flushall``: the test's broker database too)."""
    flushall(redis_server.port)
    # No socket timeout: a test's BLPOP waits its own timeout (redis-py 8's default of
    # 5 s cut a 60 s wait for a worker process short on a loaded box).
    client = aioredis.Redis.from_url(
        f"redis://127.0.0.1:{redis_server.port}/1", socket_timeout=None
    )
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def app_name() -> str:
    """A fresh app name per test."""
    return f"t{next(_names)}"
