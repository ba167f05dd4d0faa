"""A listening socket inside another process's network namespace.

A socket belongs to the network namespace it was created in, whoever later accepts on it. A
forked child enters the agent's namespaces (``setns``), creates, binds and listens, passes the
socket back over a socket pair and exits: the platform then serves the agent's loopback without
ever leaving its own namespace, and without a thread that switches namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import socket

from autorl.errors import AutoRLError

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
#: ioctl on a namespace file: the user namespace that owns it.
NS_GET_USERNS = 0xB701
LISTEN_BACKLOG = 64

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class NetnsError(AutoRLError):
    """The agent's network namespace cannot be entered."""


def _setns(fd: int, nstype: int) -> None:
    if _libc.setns(fd, nstype) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def network_owner_fd(pid: int) -> int:
    """A descriptor of the user namespace that owns ``pid``'s network namespace.

    Not root, the platform has capabilities over that namespace only from inside its owning
    user namespace (bubblewrap's outer one; the agent itself sits in a nested one).
    """
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(net, NS_GET_USERNS)
    finally:
        os.close(net)


def _enter_network_of(pid: int) -> None:
    """Join ``pid``'s network namespace (first its owning user namespace when not root)."""
    if os.geteuid() != 0:
        _setns(network_owner_fd(pid), CLONE_NEWUSER)
    _setns(os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWNET)


def listen_in_netns(pid: int, host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` in ``pid``'s network namespace."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid_child = os.fork()
    if pid_child == 0:  # only system calls and a message, then _exit
        code = 0
        try:
            parent.close()
            _enter_network_of(pid)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
            socket.send_fds(child, [b"ok"], [listener.fileno()])
        except BaseException as exc:
            code = 1
            with contextlib.suppress(OSError):
                child.sendall(f"error: {exc}".encode()[:512])
        os._exit(code)
    child.close()
    try:
        message, fds, _flags, _addr = socket.recv_fds(parent, 512, 1)
    finally:
        parent.close()
        os.waitpid(pid_child, 0)
    if message != b"ok" or not fds:
        raise NetnsError(
            f"cannot listen on {host}:{port} in the agent's network namespace "
            f"({message.decode(errors='replace') or 'no answer'})"
        )
    return socket.socket(fileno=fds[0])
