"""Three releases of one app for ``typedq verify``'s process tests
(tests/process/test_cli_verify.py): ``old`` enqueues ``place`` jobs of ``OrderV1``;
``compatible`` reads them (a field with a default added); ``incompatible`` cannot (a
required field added). The broker comes from ``--broker`` (or ``use_broker``)."""

from __future__ import annotations

import msgspec

from typedq import App

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
