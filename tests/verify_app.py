"""Three releases of one app for ``typedq verify``'s process tests
(tests/process/test_cli_verify.py): ``old`` enqueues ``place`` jobs of ``OrderV1``;
``compatible`` reads them (a field with a default added); ``incompatible`` cannot (a
required field added). The broker comes from ``--broker`` (or ``use_broker``)."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from typedq import App, Run

#: The app name of every release (the tests flush their Redis first).
NAME = "verifyapp"


class OrderV1(msgspec.Struct, frozen=True):
    id: int


class OrderV2(msgspec.Struct, frozen=True):
    id: int
    note: str = ""


class OrderV3(msgspec.Struct, frozen=True):
    id: int
    amount: int


class Placed(msgspec.Struct, frozen=True):
    ok: bool


old = App(NAME)
compatible = App(NAME)
incompatible = App(NAME)


@old.task(queue="orders", name="place")
async def place_v1(order: OrderV1) -> Placed:
    return Placed(True)


@compatible.task(queue="orders", name="place")
async def place_v2(order: OrderV2) -> Placed:
    return Placed(True)


@incompatible.task(queue="orders", name="place")
async def place_v3(order: OrderV3) -> Placed:
    return Placed(True)


# Releases of another app whose durable function ``onboard`` takes an order: running
# runs of ``runs_old`` hold OrderV1 inputs (typedq verify reads runs too).
RUNS_NAME = "verifyruns"
runs_old = App(RUNS_NAME)
runs_compatible = App(RUNS_NAME)
runs_incompatible = App(RUNS_NAME)


@runs_old.durable(queue="orders", name="onboard")
async def onboard_v1(run: Run, order: OrderV1) -> Placed:
    await run.sleep(timedelta(days=1))
    return Placed(True)


@runs_compatible.durable(queue="orders", name="onboard")
async def onboard_v2(run: Run, order: OrderV2) -> Placed:
    await run.sleep(timedelta(days=1))
    return Placed(True)


@runs_incompatible.durable(queue="orders", name="onboard")
async def onboard_v3(run: Run, order: OrderV3) -> Placed:
    await run.sleep(timedelta(days=1))
    return Placed(True)
