"""Sandbox backends, pools and the resident executor (see the Sandboxes section of the README)."""
