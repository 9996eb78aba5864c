"""The dashboard's parts without HTTP: the session and CSRF guard, payload forms from
JSON Schemas (msgspec and Pydantic models), and the SVG chart."""

from __future__ import annotations

import msgspec
import pydantic
import pytest

from typedq.broker.base import MinuteRollup
from typedq.dashboard.chart import throughput_svg
from typedq.dashboard.forms import form_fields, parse_form
from typedq.dashboard.security import Guard
from typedq.schema import model_schema
from typedq.serde import codec_for


def test_a_guard_without_token_allows_nothing() -> None:
    guard = Guard(None)
    assert guard.read_only
    assert not guard.check_token("")
    cookie = guard.new_session()
    assert guard.session(cookie) is None
    assert not guard.allows(cookie, guard.csrf(cookie.partition(".")[0]))


def test_sessions_are_signed_and_csrf_tokens_are_per_session() -> None:
    guard = Guard("tok")
    assert guard.check_token("tok")
    assert not guard.check_token("tok2")
    a, b = guard.new_session(), guard.new_session()
    sa, sb = guard.session(a), guard.session(b)
    assert sa is not None
    assert sb is not None
    assert guard.allows(a, guard.csrf(sa))
    assert not guard.allows(a, guard.csrf(sb))  # another session's token
    assert not guard.allows(a, None)
    forged = sa + "." + "0" * 64
    assert guard.session(forged) is None
    # Another token (a restarted dashboard with a new token) rejects old cookies.
    assert Guard("other").session(a) is None


class Address(msgspec.Struct):
    city: str


class Order(msgspec.Struct):
    """An order."""

    n: int
    price: float
    name: str
    rush: bool = False
    note: str | None = None
    tags: list[str] = []
    address: Address | None = None


class POrder(pydantic.BaseModel):
    n: int = pydantic.Field(title="Order number", description="from the shop")
    note: str | None = None


def test_fields_follow_the_schema_of_a_msgspec_model() -> None:
    schema = model_schema(codec_for(Order))
    fields = {f.name: f for f in form_fields(schema, {"n": 3, "price": 1.5, "name": "x"})}
    assert [fields[n].kind for n in ("n", "price", "name", "rush", "note", "tags", "address")] == [
        "integer",
        "number",
        "text",
        "checkbox",
        "text",
        "json",
        "json",
    ]
    assert not fields["n"].optional
    assert fields["note"].nullable
    assert fields["n"].value == "3"
    data = parse_form(
        list(fields.values()),
        {
            "field.n": "4",
            "field.price": "2.5",
            "field.name": "y",
            "field.rush": "on",
            "field.note": "",
            "field.tags": '["a"]',
            "field.address": '{"city": "Oslo"}',
        },
    )
    assert data == {
        "n": 4,
        "price": 2.5,
        "name": "y",
        "rush": True,
        "note": None,
        "tags": ["a"],
        "address": {"city": "Oslo"},
    }
    decoded = codec_for(Order).decode(msgspec.msgpack.encode(data))
    assert decoded.address == Address(city="Oslo")
    with pytest.raises(ValueError, match="field 'price': 'cheap' is not a number"):
        parse_form(list(fields.values()), {"field.n": "1", "field.price": "cheap"})
    with pytest.raises(ValueError, match="field 'tags': '\\[' is not JSON"):
        parse_form(list(fields.values()), {"field.n": "1", "field.price": "1", "field.tags": "["})


def test_fields_use_pydantic_titles_and_descriptions() -> None:
    schema = model_schema(codec_for(POrder))
    (n, note) = form_fields(schema, {"n": 1})
    assert n.label == "Order number"
    assert n.description == "from the shop"
    assert note.optional
    assert note.shown == ""  # not in the payload


def test_without_a_schema_the_payload_keys_are_the_fields() -> None:
    fields = form_fields(None, {"a": 1, "b": [1, 2]})
    assert [(f.name, f.shown) for f in fields] == [("a", "1"), ("b", "[1, 2]")]
    assert form_fields(None, "not a map") == []


def test_the_chart_is_labelled_and_escapes_its_text() -> None:
    minutes = [MinuteRollup(60 * i, completed=i, failed=i % 2, retried=0) for i in range(60)]
    svg = throughput_svg(minutes, label="queue <q>")
    assert svg.startswith('<svg class="chart" role="img"')
    assert "<title>queue &lt;q&gt;</title>" in svg
    assert svg.count('class="ok"') == 59
    assert svg.count('class="bad"') == 30
    empty = throughput_svg([MinuteRollup(0)] * 60, label="idle")
    assert "<rect" not in empty
