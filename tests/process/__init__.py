"""Process tier: spawns worker processes or CLI subprocesses, kills them, injects faults."""
