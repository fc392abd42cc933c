"""The learner: train loop, exactly-once data, losses, checkpoints, weight publishing."""
