"""Typed codecs: msgspec and Pydantic models, optional outputs, clear validation errors."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import msgspec
import pydantic
import pytest

from typedq.errors import ConfigError, EncodeError, InvalidPayload, PayloadTooLarge
from typedq.serde import Codec, codec_for


class Invoice(msgspec.Struct):
    customer_id: int
    invoice_id: int


class Receipt(pydantic.BaseModel):
    receipt_id: str
    total_cents: int
    issued: dt.datetime
    amount: Decimal
    blob: bytes


def test_struct_round_trip() -> None:
    codec = codec_for(Invoice)
    assert codec.decode(codec.encode(Invoice(1, 2))) == Invoice(1, 2)


def test_pydantic_round_trip_keeps_datetimes_decimals_and_bytes_exact() -> None:
    receipt = Receipt(
        receipt_id="R-1",
        total_cents=2**53 + 1,
        issued=dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
        amount=Decimal("10.10"),
        blob=b"\xff\x00\xfe",
    )
    codec = codec_for(Receipt)
    assert codec.decode(codec.encode(receipt)) == receipt


def test_optional_output_carries_none_and_the_model() -> None:
    codec: Codec[Invoice | None] = Codec(Invoice | None)  # type: ignore[arg-type]
    assert codec.decode(codec.encode(None)) is None
    assert codec.decode(codec.encode(Invoice(3, 4))) == Invoice(3, 4)
    assert codec.name.endswith("Invoice | None")
    assert codec.json_schema["anyOf"][1] == {"type": "null"}
    assert "Invoice" in codec.json_schema["$defs"]  # references resolve from the root


@pytest.mark.parametrize("codec", [codec_for(Invoice), codec_for(Receipt)])
def test_invalid_payload_names_the_field(codec: Codec[object]) -> None:
    bad = msgspec.msgpack.encode({"customer_id": "one", "invoice_id": 2, "receipt_id": 5})
    with pytest.raises(InvalidPayload) as info:
        codec.decode(bad)
    assert "$." in str(info.value)


def test_garbage_bytes_are_invalid_payload_not_a_crash() -> None:
    with pytest.raises(InvalidPayload, match="Invoice"):
        codec_for(Invoice).decode(b"\xc1\xff\x00garbage")


def test_encoding_the_wrong_model_is_an_encode_error() -> None:
    with pytest.raises(EncodeError, match="expected an instance of Invoice"):
        codec_for(Invoice).encode(Receipt)  # type: ignore[arg-type]


def test_size_limit_is_checked_on_both_sides() -> None:
    codec = Codec(Invoice, max_bytes=8)
    with pytest.raises(PayloadTooLarge, match="over the limit of 8 bytes"):
        codec.encode(Invoice(10**12, 10**12))
    with pytest.raises(PayloadTooLarge):
        codec.decode(b"\x00" * 9)


def test_non_models_are_refused_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"msgspec\.Struct or pydantic\.BaseModel"):
        Codec(int)


def test_fingerprint_is_stable_and_follows_the_schema() -> None:
    class V1(msgspec.Struct):
        a: int

    class V2(msgspec.Struct):
        a: int
        b: int = 0

    assert Codec(V1).fingerprint == Codec(V1).fingerprint
    assert len(Codec(V1).fingerprint) == 16
    assert Codec(V1).fingerprint != Codec(V2).fingerprint


class Edge(msgspec.Struct):
    text: str = ""
    number: float = 0.0
    integer: int = 0
    when: dt.datetime | None = None
    blob: bytes = b""


@pytest.mark.parametrize(
    "value",
    [
        Edge(text="nul\x00inside"),
        Edge(text="rtl \u202e emoji \U0001f600 4-byte \U00010348"),
        Edge(number=-0.0),
        Edge(number=float("inf")),
        Edge(integer=2**53 + 1),
        Edge(integer=2**64 - 1),
        Edge(integer=-(2**63)),
        Edge(when=dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5)))),
        Edge(when=dt.datetime(2026, 1, 1, 12, 0)),  # naive stays naive
        Edge(blob=bytes(range(256))),
    ],
    ids=repr,
)
def test_edge_values_round_trip_exactly(value: Edge) -> None:
    """RELIABILITY E5: every value round-trips exactly (or is refused, below)."""
    codec = codec_for(Edge)
    back = codec.decode(codec.encode(value))
    assert msgspec.msgpack.encode(back) == msgspec.msgpack.encode(value)
    if value.number == 0.0:
        assert str(back.number) == str(value.number)  # -0.0 keeps its sign


@pytest.mark.parametrize(
    "value",
    [Edge(integer=2**64), Edge(integer=-(2**63) - 1), Edge(text="lone \ud800 surrogate")],
    ids=["2**64", "-2**63-1", "lone-surrogate"],
)
def test_values_msgpack_cannot_carry_are_refused_at_encode(value: Edge) -> None:
    with pytest.raises(EncodeError, match="cannot encode Edge"):
        codec_for(Edge).encode(value)


def test_nan_round_trips_as_nan() -> None:
    codec = codec_for(Edge)
    back = codec.decode(codec.encode(Edge(number=float("nan"))))
    assert back.number != back.number  # still NaN, not silently 0 or None
