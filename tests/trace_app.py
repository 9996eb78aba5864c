"""The app the tracing test runs in a worker process (``python -m typedq worker``).

With ``$TYPEDQ_TEST_SPANS`` set it installs the OpenTelemetry SDK as the global
TracerProvider, writing each finished span as one JSON line to that file, the way an
application configures its exporter before its workers start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.support import In, Out
from typedq import App

SPANS_ENV = "TYPEDQ_TEST_SPANS"


class JsonLines(SpanExporter):
    """Each span as one JSON line appended to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


if os.environ.get(SPANS_ENV):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(os.environ[SPANS_ENV])))
    trace.set_tracer_provider(provider)

app = App("traced", tracing=True)
tracer = trace.get_tracer("tests.trace_app")


@app.task(queue="traced")
async def echo(x: In) -> Out:
    """Returns its input, inside a span of its own."""
    with tracer.start_as_current_span("echo work"):
        return Out(x.n)
