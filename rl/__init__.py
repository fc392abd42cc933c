"""Config, run directory, scheduling, and (as they land) algorithms, rewards, tasks, store and learner."""
