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

Everything else is allowed. Built as classic BPF by hand for x86-64 and
aarch64; on another architecture `program()` returns None and the sandbox
says so (`enforced["syscalls"]`).
"""

from __future__ import annotations

import errno
import platform
import struct

# seccomp_data: nr (u32) at 0, arch (u32) at 4, ip (u64) at 8, args[6] (u64) from 16
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_X32_BIT = 0x40000000
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
AF_VSOCK = 40
CLONE_NEWUSER = 0x10000000

# arch: (AUDIT_ARCH, socket, unshare, clone, clone3)
_ARCHES = {
    "x86_64": (0xC000003E, 41, 272, 56, 435),
    "aarch64": (0xC00000B7, 198, 97, 220, 435),
}


def program() -> bytes | None:
    """The filter for this machine's architecture, or None where unknown."""
    spec = _ARCHES.get(platform.machine())
    if spec is None:
        return None
    arch, nr_socket, nr_unshare, nr_clone, nr_clone3 = spec
    enosys = _ERRNO | errno.ENOSYS
    rows = [  # (code, jump if true, jump if false, k): jumps count from the next row
        (_LD_W_ABS, 0, 0, _ARCH),  # 0
        (_JEQ_K, 1, 0, arch),  # 1: this ABI -> 3
        (_RET_K, 0, 0, enosys),  # 2: another (i386 compat): refused whole
        (_LD_W_ABS, 0, 0, _NR),  # 3
        (_JGE_K, 4, 0, _X32_BIT),  # 4: x32 numbers -> 9
        (_JEQ_K, 5, 0, nr_socket),  # 5 -> 11
        (_JEQ_K, 8, 0, nr_unshare),  # 6 -> 15
        (_JEQ_K, 7, 0, nr_clone),  # 7 -> 15
        (_JEQ_K, 0, 1, nr_clone3),  # 8 -> 9, else 10
        (_RET_K, 0, 0, enosys),  # 9
        (_RET_K, 0, 0, _ALLOW),  # 10
        (_LD_W_ABS, 0, 0, _ARG0),  # 11: socket(domain, ...)
        (_JEQ_K, 0, 1, AF_VSOCK),  # 12
        (_RET_K, 0, 0, _ERRNO | errno.EAFNOSUPPORT),  # 13
        (_RET_K, 0, 0, _ALLOW),  # 14
        (_LD_W_ABS, 0, 0, _ARG0),  # 15: unshare(flags) / clone(flags, ...)
        (_JSET_K, 0, 1, CLONE_NEWUSER),  # 16
        (_RET_K, 0, 0, _ERRNO | errno.EPERM),  # 17
        (_RET_K, 0, 0, _ALLOW),  # 18
    ]
    return b"".join(struct.pack("=HBBI", *row) for row in rows)
