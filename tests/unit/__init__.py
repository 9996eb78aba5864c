"""Unit tier: in one process, on the embedded broker; no redis-server, no subprocess."""
