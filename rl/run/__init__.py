"""Run directory, roles, executors (submitit), launch and status."""
