"""Rollouts: the episode loop (and, as it lands, the worker loop, queue and records)."""
