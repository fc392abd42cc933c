"""The base of the errors a user can cause or fix (standard library only).

Every such error subclasses `SarlError` and a built-in exception that says
what kind it is (`ConfigError(SarlError, ValueError)`). The `sarl` command
catches `SarlError` and prints its message with a non-zero exit; anything
else is a bug in sarl and keeps its traceback.
"""

from __future__ import annotations


class SarlError(Exception):
    """An error whose message tells the user what is wrong and where."""

    exit_code = 1


class ConfigError(SarlError, ValueError):
    """A configuration that cannot run; the message names the file and key."""

    exit_code = 2
