"""The `smoke` role: a plumbing check of a cluster, with no model."""
