"""A small seccomp filter for bubblewrap's `--seccomp FD` (standard library only).

The network namespace covers IP and Unix sockets, not AF_VSOCK: on a virtual
machine a sandbox could reach the hypervisor's vsock services. And user
namespaces created inside give full capabilities over new mount and network
namespaces, a wide kernel attack surface. The filter refuses both:

  socket(AF_VSOCK, ...)              -> EAFNOSUPPORT
  unshare / clone with CLONE_NEWUSER -> EPERM
  clone3                             -> ENOSYS (its flags are in memory that
                                        seccomp cannot read; glibc then falls
                                        back to clone, which is checked)
  prctl(PR_SET_DUMPABLE, non-zero)   -> EPERM (a process made dumpable again
                                        could be read through /proc by any
                                        process of the sandbox's uid)

Everything else is allowed. Built as classic BPF by hand for x86-64 and
aarch64; on another architecture `program()` returns None and the sandbox
says so (`enforced["syscalls"]`).
"""

from __future__ import annotations

import errno
import platform
import struct

# seccomp_data: nr (u32) at 0, arch (u32) at 4, ip (u64) at 8, args[6] (u64) from 16
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_X32_BIT = 0x40000000
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
AF_VSOCK = 40
CLONE_NEWUSER = 0x10000000
PR_SET_DUMPABLE = 4

# arch: (AUDIT_ARCH, socket, unshare, clone, clone3, prctl)
_ARCHES = {
    "x86_64": (0xC000003E, 41, 272, 56, 435, 157),
    "aarch64": (0xC00000B7, 198, 97, 220, 435, 167),
}


def program() -> bytes | None:
    """The filter for this machine's architecture, or None where unknown."""
    spec = _ARCHES.get(platform.machine())
    if spec is None:
        return None
    arch, nr_socket, nr_unshare, nr_clone, nr_clone3, nr_prctl = spec
    enosys = _ERRNO | errno.ENOSYS
    rows = [  # (code, jump if true, jump if false, k): jumps count from the next row
        (_LD_W_ABS, 0, 0, _ARCH),  # 0
        (_JEQ_K, 1, 0, arch),  # 1: this ABI -> 3
        (_RET_K, 0, 0, enosys),  # 2: another (i386 compat): refused whole
        (_LD_W_ABS, 0, 0, _NR),  # 3
        (_JGE_K, 5, 0, _X32_BIT),  # 4: x32 numbers -> 10
        (_JEQ_K, 6, 0, nr_socket),  # 5 -> 12
        (_JEQ_K, 9, 0, nr_unshare),  # 6 -> 16
        (_JEQ_K, 8, 0, nr_clone),  # 7 -> 16
        (_JEQ_K, 11, 0, nr_prctl),  # 8 -> 20
        (_JEQ_K, 0, 1, nr_clone3),  # 9 -> 10, else 11
        (_RET_K, 0, 0, enosys),  # 10
        (_RET_K, 0, 0, _ALLOW),  # 11
        (_LD_W_ABS, 0, 0, _ARG0),  # 12: socket(domain, ...)
        (_JEQ_K, 0, 1, AF_VSOCK),  # 13
        (_RET_K, 0, 0, _ERRNO | errno.EAFNOSUPPORT),  # 14
        (_RET_K, 0, 0, _ALLOW),  # 15
        (_LD_W_ABS, 0, 0, _ARG0),  # 16: unshare(flags) / clone(flags, ...)
        (_JSET_K, 0, 1, CLONE_NEWUSER),  # 17
        (_RET_K, 0, 0, _ERRNO | errno.EPERM),  # 18
        (_RET_K, 0, 0, _ALLOW),  # 19
        (_LD_W_ABS, 0, 0, _ARG0),  # 20: prctl(option, arg2, ...)
        (_JEQ_K, 0, 3, PR_SET_DUMPABLE),  # 21: else -> 25
        (_LD_W_ABS, 0, 0, _ARG1),  # 22
        (_JEQ_K, 1, 0, 0),  # 23: dumpable = 0 -> 25
        (_RET_K, 0, 0, _ERRNO | errno.EPERM),  # 24
        (_RET_K, 0, 0, _ALLOW),  # 25
    ]
    return b"".join(struct.pack("=HBBI", *row) for row in rows)
