"""Redis tier: needs a redis-server (spawned by the suite); no worker processes."""
