"""The agent: the one module that turns a task into prompts, parses the
policy's actions, runs them and formats observations. Rollout workers,
evaluation and serving use it alike, so what the model learns is what it
will do."""
