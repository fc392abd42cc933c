"""Entry points: the `sarl` command and one module per role."""
