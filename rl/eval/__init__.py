"""Evaluation of a weight version on a task file: `sarl eval` and the `[eval]` section."""
