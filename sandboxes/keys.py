"""Kernel keyrings: a sandbox starts with none of the host's keys.

On a cluster the session keyring holds Kerberos (`KEYRING:` credential
caches) and AFS tokens; a process keeps its parent's session keyring across
fork and exec. So, before a sandbox starts (in sandboxes/enter.py, as root):

  * it joins a new, empty, anonymous session keyring: the worker's keys are
    no longer in its possession;
  * the slot uid's user and user-session keyrings are cleared (a key that
    an earlier episode left there would otherwise reach the next one).

The resident clears the slot uid's keyrings again on every reset. Standard
library only (this file is also imported by the resident inside the sandbox).
"""

from __future__ import annotations

import ctypes
import os

_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219), "ppc64le": (269, 271)}  # (add_key, keyctl)
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5

# os.uname, not platform.machine: importing platform cost 10 ms of each sandbox's start
_NR_KEYCTL = _SYSCALLS.get(os.uname().machine, (None, None))[1]
_syscall = ctypes.CDLL(None, use_errno=True).syscall if _NR_KEYCTL is not None else None


def _keyctl(op: int, arg: int | None) -> int:
    if _syscall is None:
        return -1  # an architecture we do not know the syscall number of: nothing to do here
    return int(_syscall(_NR_KEYCTL, ctypes.c_long(op), ctypes.c_long(arg) if arg is not None else None))


def clear_user_keyrings() -> None:
    """Empty the calling uid's user and user-session keyrings."""
    for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        _keyctl(KEYCTL_CLEAR, ring)


def fresh_keyrings(uid: int) -> None:
    """In a child about to exec a sandbox, as root: a new empty session
    keyring, and the keyrings of `uid` emptied. Without root, only the first."""
    _keyctl(KEYCTL_JOIN_SESSION_KEYRING, None)
    if os.geteuid() != 0:
        return
    os.setresuid(uid, uid, 0)  # the saved uid stays 0, to come back
    try:
        clear_user_keyrings()
    finally:
        os.setresuid(0, 0, 0)
