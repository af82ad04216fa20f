"""Who is at the other end of a Unix socket (``SO_PEERCRED``): gpuscope's sockets serve only their own user.

Abstract Unix sockets (a name with a leading NUL) have no permissions and leave no file behind; anyone on the
machine may connect to one, or bind a name that looks like gpuscope's. Both of gpuscope's uses read the peer's
credentials before anything else: the PM evaluation workers' socket (:mod:`gpuscope._pm_sampling.workers`) and the
rendezvous of processes that hold a GPU's counters (:mod:`gpuscope._gpu.rendezvous`).
"""

from __future__ import annotations

import socket
import struct

__all__ = ["peer"]


def peer(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a connected Unix socket, as the kernel saw it connect (or,
    from the connecting side, listen)."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid
