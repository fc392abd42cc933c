"""The generator role: its loop, the weight versions it loads, its curves.
Its HTTP service and client are rl.serving."""
