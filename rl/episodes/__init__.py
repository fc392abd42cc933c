"""One episode of the agent on a task (episode.py) and the training samples
it yields (samples.py): played by the rollout workers, by evaluation and by
the benchmarks alike."""
