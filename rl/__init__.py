"""Config, run directory, scheduling, the exchange store, generation, tasks and verification."""
