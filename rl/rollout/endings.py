"""Why an episode or a group ends before its group is committed."""

from __future__ import annotations


class Abandon(Exception):
    """The group cannot be committed; the message is the recorded reason."""


class InfraFailure(Abandon):
    """Infrastructure failures outlasted the retries: never a policy failure."""


class Stopping(Exception):
    """The worker is stopping (USR2): in-flight episodes end unplayed."""
