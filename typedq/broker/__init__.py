"""Brokers: one module per backend behind :class:`~typedq.broker.base.Broker`.

:func:`broker_from_url` is the only place that names every backend.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigError
from .base import Broker
from .settings import BrokerSettings

__all__ = ["Broker", "BrokerSettings", "broker_from_url", "redact_url"]


def broker_from_url(url: str, settings: BrokerSettings) -> Broker:
    """Make the broker a URL names: ``memory://``, ``redis://`` / ``rediss://``,
    ``redis+cluster://`` / ``rediss+cluster://`` or ``postgresql://`` / ``postgres://``."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from .memory import MemoryBroker

        return MemoryBroker(settings)
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        from .redis import RedisBroker

        return RedisBroker(url, settings)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresBroker

        return PostgresBroker(url, settings)
    raise ConfigError(
        f"unknown broker URL {redact_url(url)!r}: use memory:// (embedded), "
        "redis://host:port/db, rediss://host:port/db, redis+cluster://host:port[,host:port...] "
        "or postgresql://user@host:port/db"
    )


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``, safe to log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
