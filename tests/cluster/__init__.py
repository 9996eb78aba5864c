"""Cluster tier: needs the local Redis Cluster (spawned once per session)."""
