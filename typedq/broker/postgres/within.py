"""Transactional enqueue (``task.enqueue(..., within=conn)``): the broker's ``enqueue``
function run on the caller's own connection, inside the transaction it has open.

The jobs are rows like any other, written by the same schema function, so they exist if
and only if that transaction commits; the function's ``pg_notify`` is delivered at the
commit too, so workers hear of the jobs exactly when they become visible.

A connection is accepted as what its driver made: an asyncpg ``Connection`` (or a pool's
proxy of one), a psycopg 3 ``AsyncConnection``, or SQLAlchemy's ``AsyncSession`` /
``AsyncConnection`` (their driver connection underneath, asyncpg's or psycopg's). None of
these libraries is imported unless the caller passes one of its objects: the module
knows them by their module names.
"""

from __future__ import annotations

from typing import Any

from ...errors import BrokerError, ConfigError, InvalidOption
from .connection import REFUSALS, broker_error, refusal

__all__ = ["EnqueueArgs", "enqueue_flow_within", "enqueue_within", "within_error"]

#: The enqueue function's arguments, in its parameters' order (schema.py).
EnqueueArgs = tuple[
    str,
    list[str],
    list[str],
    list[bytes],
    list[int],
    list[Any],
    list[Any],
    int,
    str,
    list[str],
    list[str],
    list[str],
]

#: The enqueue call for psycopg: its placeholders are ``%s``, and the parameters' types are
#: stated (psycopg sends Python ints as the smallest fitting type, and a function's
#: arguments are not cast to its parameters' types implicitly).
_PSYCOPG_ENQUEUE = (
    'SELECT "{schema}".enqueue(%s::text, %s::text[], %s::text[], %s::bytea[], %s::integer[], '
    "%s::double precision[], %s::double precision[], %s::integer, %s::text, %s::text[], "
    "%s::text[], %s::text[])"
)


#: The enqueue_flow call for psycopg (see _PSYCOPG_ENQUEUE).
_PSYCOPG_ENQUEUE_FLOW = (
    'SELECT "{schema}".enqueue_flow(%s::text, %s::text, %s::integer, %s::integer, '
    "%s::boolean, %s::boolean, %s::boolean, %s::text[], %s::text[], %s::bytea[], "
    "%s::integer[], %s::integer[], %s::text[], %s::text[], %s::text[], %s::integer, "
    "%s::bigint[], %s::text, %s::integer)"
)


def _module(obj: object) -> str:
    return type(obj).__module__ or ""


def _refuse(conn: object, why: str) -> InvalidOption:
    return InvalidOption(f"within= got {type(conn).__module__}.{type(conn).__name__}: {why}")


async def _driver(conn: object) -> tuple[str, Any]:
    """``("asyncpg" | "psycopg", the driver's connection)`` under ``conn``, its transaction
    begun; InvalidOption for anything else, or a connection with no transaction open."""
    module = _module(conn)
    if module.startswith("sqlalchemy"):
        return await _from_sqlalchemy(conn)
    if module.startswith("asyncpg"):
        if not callable(getattr(conn, "is_in_transaction", None)):
            raise _refuse(conn, "not an asyncpg Connection")
        if not conn.is_in_transaction():  # type: ignore[attr-defined]
            raise _refuse(
                conn,
                "no transaction is open on it, so the job would not wait for your commit; "
                "enqueue inside `async with conn.transaction():` (or drop within=)",
            )
        return "asyncpg", conn
    if module.startswith("psycopg"):
        info = getattr(conn, "info", None)
        if info is None or not hasattr(conn, "cursor"):
            raise _refuse(conn, "not a psycopg AsyncConnection")
        if conn.autocommit and int(info.transaction_status) == 0:  # type: ignore[attr-defined]
            # Autocommit and idle: the enqueue would commit on its own.
            raise _refuse(
                conn,
                "no transaction is open on it (autocommit), so the job would not wait for "
                "your commit; enqueue inside `async with conn.transaction():` (or drop within=)",
            )
        return "psycopg", conn
    raise _refuse(
        conn,
        "pass the connection your transaction runs on: a psycopg 3 AsyncConnection, an "
        "asyncpg Connection, or a SQLAlchemy AsyncSession or AsyncConnection",
    )


async def _from_sqlalchemy(conn: object) -> tuple[str, Any]:
    """The driver connection of a SQLAlchemy ``AsyncSession`` or ``AsyncConnection``, in
    the transaction SQLAlchemy has begun on it."""
    aconn: Any = conn
    if type(conn).__name__ == "AsyncSession":
        aconn = await conn.connection()  # type: ignore[attr-defined]  # begins the session's transaction
    if type(aconn).__name__ != "AsyncConnection" or not hasattr(aconn, "get_raw_connection"):
        raise _refuse(
            conn, "a SQLAlchemy object that is neither an AsyncSession nor an AsyncConnection"
        )
    if aconn.dialect.name != "postgresql":
        raise _refuse(conn, f"its database is {aconn.dialect.name}, not PostgreSQL")
    if not aconn.in_transaction():
        raise _refuse(
            conn,
            "no transaction is open on it, so the job would not wait for your commit; "
            "enqueue inside `async with conn.begin():` (or drop within=)",
        )
    # A driver adapter may begin its own transaction lazily, at its first statement: one
    # statement through SQLAlchemy first, so what follows on the raw connection is in it.
    await aconn.exec_driver_sql("SELECT 1")
    raw = await aconn.get_raw_connection()
    driver = raw.driver_connection
    kind, _ = await _driver(driver)
    return kind, driver


async def enqueue_within(
    conn: object, schema: str, asyncpg_sql: str, args: EnqueueArgs
) -> list[bool]:
    """Run the schema's enqueue on ``conn``; per job whether it was created (False: a job
    with its id existed).

    :raises InvalidOption: ``conn`` is not a connection this broker can use, or has no
        transaction open
    """
    kind, driver = await _driver(conn)
    if kind == "asyncpg":
        created = await driver.fetchval(asyncpg_sql, *args)
    else:
        cursor = await driver.execute(_PSYCOPG_ENQUEUE.format(schema=schema), args)
        row = await cursor.fetchone()
        created = row[0] if row else None
    if created is None or len(created) != len(args[1]):
        raise RuntimeError(f"the enqueue function answered {created!r} for {len(args[1])} jobs")
    return [bool(c) for c in created]


async def enqueue_flow_within(
    conn: object, schema: str, asyncpg_sql: str, args: tuple[Any, ...]
) -> int:
    """Run the schema's enqueue_flow on ``conn`` (its arguments ``args``); its answer:
    0 stored, 1 a job with the flow's id existed.

    :raises InvalidOption: as :func:`enqueue_within`
    """
    kind, driver = await _driver(conn)
    if kind == "asyncpg":
        code = await driver.fetchval(asyncpg_sql, *args)
    else:
        cursor = await driver.execute(_PSYCOPG_ENQUEUE_FLOW.format(schema=schema), args)
        row = await cursor.fetchone()
        code = row[0] if row else None
    if code not in (0, 1):
        raise RuntimeError(f"the enqueue_flow function answered {code!r}")
    return int(code)


def within_error(exc: BaseException, where: str, cap: int) -> BrokerError | ConfigError:
    """An error of the enqueue on the caller's connection as typedq's: a full queue is
    QueueFull (the function refused, nothing stored), psycopg's errors are named as
    asyncpg's are (:func:`~typedq.broker.postgres.connection.broker_error`). The caller's
    transaction is then aborted, as after any failed statement of theirs."""
    if _module(exc).startswith("psycopg"):
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate in REFUSALS:
            diag = getattr(exc, "diag", None)
            return refusal(sqlstate, str(getattr(diag, "message_primary", None) or exc), cap)
        return BrokerError(
            f"PostgreSQL at {where} failed enqueue within your transaction: "
            f"{type(exc).__name__}: {exc}"
        )
    return broker_error(exc, "enqueue within your transaction", where, cap)
