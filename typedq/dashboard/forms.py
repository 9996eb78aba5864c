"""Payloads as tables and forms, from the task's input JSON Schema.

A job page shows the payload one row per property of the input model (its title,
type and description from the schema); "re-run with edited input" is a form with one
labelled input per property: text, number or checkbox for scalar properties, a JSON
text area for anything else. :func:`parse_form` turns the posted form back into data
that the caller validates against the input model (one clear message on bad input).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = ["FormField", "form_fields", "parse_form"]

_SCALARS = {"string": "text", "integer": "integer", "number": "number", "boolean": "checkbox"}


class FormField(msgspec.Struct, frozen=True, kw_only=True):
    """One property of the input model as a table row and a form input."""

    name: str
    label: str
    #: ``text``, ``integer``, ``number``, ``checkbox`` or ``json``.
    kind: str
    #: The current value as the input shows it (JSON text for ``json``).
    value: str
    #: The value as the table shows it.
    shown: str
    #: May be left empty: absent (the model's default) or, when ``nullable``, null.
    optional: bool
    nullable: bool = False
    description: str = ""


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if isinstance(found, Mapping):
            return found
    return node


def _kind(prop: Mapping[str, Any]) -> tuple[str, bool]:
    """The input kind of a property schema, and whether it may be null."""
    kind = _SCALARS.get(str(prop.get("type")))
    if kind is not None:
        return kind, False
    options = prop.get("anyOf")
    if isinstance(options, list):
        kinds = [o.get("type") for o in options if isinstance(o, Mapping)]
        rest = [k for k in kinds if k != "null"]
        if len(rest) == 1 and len(kinds) == 2 and rest[0] in _SCALARS and rest[0] != "boolean":
            return _SCALARS[str(rest[0])], True
    return "json", False


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def form_fields(schema: Mapping[str, Any] | None, payload: Any) -> list[FormField]:
    """The payload's fields in the input model's order (or the payload's own keys
    when there is no schema)."""
    data = payload if isinstance(payload, Mapping) else {}
    model = _resolve(schema, schema) if schema is not None else {}
    props = model.get("properties")
    if not isinstance(props, Mapping):
        return [
            FormField(
                name=str(k),
                label=str(k),
                kind="json",
                value=_text(v),
                shown=_text(v),
                optional=True,
            )
            for k, v in data.items()
        ]
    required = set(model.get("required", ()))
    out = []
    for name, raw in props.items():
        prop = _resolve(schema or {}, raw) if isinstance(raw, Mapping) else {}
        kind, nullable = _kind(prop)
        value = data.get(name)
        if kind == "json":
            text = "" if name not in data else json.dumps(value, default=str)
        elif kind == "checkbox":
            text = "on" if value else ""
        else:
            text = "" if value is None else str(value)
        out.append(
            FormField(
                name=str(name),
                label=str(prop.get("title") or name),
                kind=kind,
                value=text,
                shown="" if name not in data else _text(value),
                optional=nullable or name not in required,
                nullable=nullable,
                description=str(prop.get("description") or ""),
            )
        )
    return out


def parse_form(fields: list[FormField], form: Mapping[str, str]) -> dict[str, Any]:
    """The data a posted re-run form holds, typed by each field's kind.

    :raises ValueError: one line naming the field and what is wrong with its value
    """
    data: dict[str, Any] = {}
    for field in fields:
        raw = form.get(f"field.{field.name}", "")
        if field.kind == "checkbox":
            data[field.name] = raw == "on"
            continue
        if raw.strip() == "" and field.optional:
            if field.nullable:
                data[field.name] = None
            continue
        try:
            if field.kind == "integer":
                data[field.name] = int(raw)
            elif field.kind == "number":
                data[field.name] = float(raw)
            elif field.kind == "json":
                data[field.name] = json.loads(raw)
            else:
                data[field.name] = raw
        except ValueError:
            wanted = {"integer": "an integer", "number": "a number", "json": "JSON"}[field.kind]
            raise ValueError(f"field {field.label!r}: {raw!r} is not {wanted}") from None
    return data
