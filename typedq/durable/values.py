"""How a ``run.do`` block's value is stored in a durable run's log (:class:`ValueCodec`):
a model's codec, msgspec for ``type=``, or plain msgpack, which refuses a value it could
not give back as such."""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import ConfigError
from ..serde import Codec, codec_for, is_model_type

__all__ = ["ValueCodec"]


_PLAIN = (type(None), bool, int, float, str, bytes)
_msgpack = msgspec.msgpack.Encoder()
_untyped = msgspec.msgpack.Decoder()


def _is_plain(value: object) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


class ValueCodec:
    """How a ``do`` block's value is stored: a model's codec, msgspec for ``type=``, or
    plain msgpack."""

    def __init__(self, name: str, tp: type[Any] | None) -> None:
        self.name = name
        self.type = tp
        self._model: Codec[Any] | None = (
            codec_for(tp) if tp is not None and is_model_type(tp) else None
        )
        self._decoder: msgspec.msgpack.Decoder[Any] = (
            _untyped if tp is None or self._model else msgspec.msgpack.Decoder(tp)
        )

    def encode(self, value: Any) -> bytes:
        if self._model is not None:
            return self._model.encode(value)
        if self.type is None and not _is_plain(value):
            raise ConfigError(
                f"run.do({self.name!r}) returned a {type(value).__qualname__}, which the log "
                "cannot give back as such: pass type=... (a model, a dataclass, tuple[...]) "
                "or return plain values (None, bool, int, float, str, bytes, list, dict)"
            )
        return _msgpack.encode(value)

    def decode(self, data: bytes) -> Any:
        if self._model is not None:
            return self._model.decode(data)
        return self._decoder.decode(data)
