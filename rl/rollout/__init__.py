"""The rollout role: its loop, the worker, the queue, the shares of groups,
the harness. The episode it plays is rl.episodes."""
