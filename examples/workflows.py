"""typedq workflows: a chain, a fan-out with its fan-in, and a collecting fan-in.

Run it with ``python examples/workflows.py`` (embedded broker), or with
``TYPEDQ_BROKER=redis://localhost:6379/0`` to run the same code on Redis. mypy checks
every ``then``: a step whose input is not the previous step's output is a type error.
"""

from __future__ import annotations

import anyio
import msgspec
from pydantic import BaseModel

from typedq import App, Failed, JobFailed, Ok


class RawDoc(msgspec.Struct):
    text: str


class Parsed(msgspec.Struct):
    words: list[str]


class Stored(BaseModel):
    doc_id: str
    words: int


class Image(msgspec.Struct):
    url: str


class Thumb(BaseModel):
    url: str
    width: int


class Album(msgspec.Struct):
    urls: list[str]


app = App("media")


@app.task
async def parse(doc: RawDoc) -> Parsed:
    return Parsed(words=doc.text.split())


@app.task
async def store(doc: Parsed) -> Stored:
    return Stored(doc_id=f"doc-{len(doc.words)}", words=len(doc.words))


@app.task(retries=1)
async def resize(image: Image) -> Thumb:
    if image.url.endswith(".bmp"):
        raise ValueError(f"cannot resize {image.url}")
    return Thumb(url=image.url.replace(".png", "-64.png"), width=64)


@app.task
async def make_album(thumbs: list[Thumb]) -> Album:
    """A fan-in callback: once every member completed, their results in input order."""
    return Album(urls=[t.url for t in thumbs])


@app.task
async def partial_album(outcomes: list[Ok[Thumb] | Failed]) -> Album:
    """A collecting fan-in: every member's outcome, failures included, as typed data."""
    return Album(urls=[o.value.url if isinstance(o, Ok) else "(failed)" for o in outcomes])


async def main() -> None:
    async with app, app.worker(concurrency=16):
        print("1. a chain: parse, then store")
        job = await parse.then(store).enqueue(RawDoc(text="typed tasks end to end"))
        print(f"   {await job.result(timeout=10)!r}")  # mypy knows: Stored

        print("2. a fan-out and its fan-in")
        images = [Image(url=f"img{i}.png") for i in range(5)]
        thumbs = await (await resize.map(images).enqueue()).result(timeout=10)
        print(f"   {len(thumbs)} thumbs, first {thumbs[0].url}")  # list[Thumb]
        album = await resize.map(images).then(make_album).enqueue()
        print(f"   {await album.result(timeout=10)!r}")

        print("3. a member fails: the fan-in fails; collect gets every outcome")
        mixed = [*images[:2], Image(url="scan.bmp")]
        try:
            await (await resize.map(mixed).then(make_album).enqueue()).result(timeout=10)
        except JobFailed as failure:
            print(f"   flow failed: {failure.record.message}")
        partial = await resize.map(mixed).collect(partial_album).enqueue()
        print(f"   {await partial.result(timeout=10)!r}")


if __name__ == "__main__":
    anyio.run(main)
