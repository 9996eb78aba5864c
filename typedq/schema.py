"""``typedq schema``: each task's contract as JSON Schema, for producers in any language.

For every task: its queue, the JSON Schema of its input (what the worker validates),
of its output (what the worker returns), of each declared domain error, and the input
schema's fingerprint, which a producer puts in the envelope so the worker can tell a
stale producer (see docs/producers.md). msgspec Structs and Pydantic models both work.

Payloads travel as MessagePack of an object matching the input schema, inside the
envelope described under ``envelope``: a MessagePack array in the field order shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pydantic

from .app import App
from .broker.base import JobMessage
from .serde import Codec, codec_for
from .stubgen import select_tasks

__all__ = ["app_schema", "model_schema"]


def model_schema(codec: Codec[Any], *, mode: str = "validation") -> dict[str, Any]:
    """The JSON Schema of a codec's model; ``mode="serialization"`` for outputs (Pydantic).

    :param codec: the task's input or output codec
    :param mode: Pydantic's schema mode; msgspec has one schema for both directions
    """
    tp: object = codec.type  # a model, None, or list[Model] for a fan-in callback
    if tp is type(None):
        return {"type": "null"}
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return tp.model_json_schema(
            mode="serialization" if mode == "serialization" else "validation"
        )
    return codec.json_schema


def app_schema(app: App, tasks: Sequence[str] = ()) -> dict[str, Any]:
    """The contract of ``app``'s tasks (or just ``tasks``), ready for ``json.dumps``.

    :raises ConfigError: an unknown task name, or an app with no tasks
    """
    described: dict[str, Any] = {}
    for task in select_tasks(app, tasks):
        described[task.name] = {
            "queue": task.queue,
            "input_model": task.input.name,
            "output_model": task.output.name,
            "input_fingerprint": task.input.fingerprint,
            "input": model_schema(task.input),
            "output": model_schema(task.output, mode="serialization"),
            "errors": {
                codec_for(error).name: model_schema(codec_for(error), mode="serialization")
                for error in task.options.errors
            },
            "defaults": {
                "retries": task.options.retries,
                "timeout": task.options.timeout,
                "priority": task.options.priority,
            },
        }
    return {
        "app": app.name,
        "encoding": "msgpack",
        "envelope": msgspec.json.schema(JobMessage),
        "tasks": described,
    }
