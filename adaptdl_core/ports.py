"""The port of a job's store, held from the moment it is picked until the store listens on it.

A port picked free and released before its server binds it (bind to port 0, read the
port, close) can be taken in between by any other process: the store then fails with
``EADDRINUSE``, or a replica reaches the wrong server. Instead, :class:`HeldPort` binds a
socket to a free port and keeps it bound, not listening (a connection meanwhile is
refused, as by a closed port, and replicas retry until the rendezvous deadline), until
replica 0's store takes that very socket and listens on it (torch's ``TCPStore`` with
``master_listen_fd``; Linux). The port is never free in between.

The socket reaches replica 0's store in one of two ways:

* **Replica 0 in another process** (a launcher's child): the child inherits the socket
  (``subprocess.Popen(..., pass_fds=[held.fileno()])``) and finds it named by
  ``ADAPTDL_MASTER_FD`` (:meth:`HeldPort.env`); the launcher then closes its own copy.
* **Replica 0 in this process** (a Ray actor that runs the replica's function, or a forked
  child): :meth:`HeldPort.keep_for_store` leaves the socket in this process's job
  context.

:func:`take_for_store`, called by :func:`adaptdl_core.collective.initialize` on replica 0,
hands the socket over (its file descriptor, once), after checking that it is bound to the
job's master port. A held port that no store took is closed when the job context is reset
(:func:`adaptdl_core.context.reset`) or another port is kept in its place.
"""

from __future__ import annotations

import logging
import os
import socket

from adaptdl_core import context, env

__all__ = ["HeldPort", "hold_for_store", "take_for_store", "FD_VARIABLE"]

LOG = logging.getLogger(__name__)

#: The variable that names an inherited socket for replica 0's store (see the module doc).
FD_VARIABLE = "ADAPTDL_MASTER_FD"


class HeldPort:
    """A TCP socket bound to a free port of ``host`` and held, not listening.

    Arguments:
        host: the address to bind (``"127.0.0.1"``: this machine only; ``""``: every
            interface, for a store that replicas on other nodes reach).

    Attributes:
        port: the port (held until :meth:`close`, or until a store takes the socket).

    Raises:
        OSError: no port could be bound on ``host``.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.bind((host, 0))
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    @classmethod
    def _adopt(cls, fd: int) -> "HeldPort":
        """Own the inherited socket ``fd`` (bound to a port).

        Raises:
            ValueError: ``fd`` is not an open TCP socket bound to a port.
        """
        held = cls.__new__(cls)
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ValueError(f"{FD_VARIABLE}={fd} is not an open socket ({exc}); it must "
                             "name a socket inherited from the launcher (or be unset)") \
                from None
        held._sock, held.port = sock, sock.getsockname()[1]
        if sock.type != socket.SOCK_STREAM or held.port == 0:
            held.close()
            raise ValueError(f"{FD_VARIABLE}={fd} is not a TCP socket bound to a port")
        return held

    @property
    def closed(self) -> bool:
        """True once the socket was closed or handed over."""
        return self._sock is None

    def fileno(self) -> int:
        """The socket's file descriptor (for ``pass_fds``).

        Raises:
            ValueError: the socket was closed or handed over.
        """
        if self._sock is None:
            raise ValueError(f"port {self.port} is no longer held here")
        return self._sock.fileno()

    def env(self) -> dict[str, str]:
        """The variable that names this socket to replica 0 in a child process started
        with ``pass_fds=[self.fileno()]``."""
        return {FD_VARIABLE: str(self.fileno())}

    def keep_for_store(self) -> int:
        """Leave this socket in this process's job context for replica 0's store, which
        :func:`take_for_store` hands it to (a port kept there before is closed). Returns
        :attr:`port`."""
        ctx = context.current()
        previous, ctx.held_port = ctx.held_port, self
        if previous is not None and previous is not self:
            previous.close()
        return self.port

    def detach(self) -> int:
        """Give the socket up: returns its file descriptor, now the caller's to close.

        Raises:
            ValueError: the socket was closed or handed over.
        """
        fd = self.fileno()
        sock, self._sock = self._sock, None
        sock.detach()
        return fd

    def close(self) -> None:
        """Release the port (nothing if it was closed or handed over)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> "HeldPort":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HeldPort(port={self.port}, {'closed' if self.closed else 'held'})"


def hold_for_store(host: str = "") -> int:
    """Bind a free port of ``host`` (default: every interface) and keep it in this
    process for replica 0's store (:meth:`HeldPort.keep_for_store`); returns the port.

    Raises:
        OSError: no port could be bound.
    """
    return HeldPort(host).keep_for_store()


def take_for_store(port: int) -> int | None:
    """For replica 0's store on ``port``: the file descriptor of the socket held for it,
    now the caller's (the store's), or ``None`` when none is held (the store binds the
    port itself).

    The socket kept in this process (:meth:`HeldPort.keep_for_store`) is used if it is
    bound to ``port`` (else closed: it was held for another job); else the inherited one
    named by ``ADAPTDL_MASTER_FD``, which is removed from the environment (a socket is
    handed over once).

    Raises:
        ValueError: ``ADAPTDL_MASTER_FD`` is not an integer, not a bound TCP socket, or
            bound to another port than ``port``.
    """
    ctx = context.current()
    kept, ctx.held_port = ctx.held_port, None
    if kept is not None:
        if not kept.closed and kept.port == port:
            return kept.detach()
        LOG.debug("a held port %s is not the store's port %d: released", kept, port)
        kept.close()
    fd = env.master_fd()
    os.environ.pop(FD_VARIABLE, None)
    if fd is None:
        return None
    inherited = HeldPort._adopt(fd)
    if inherited.port != port:
        inherited.close()
        raise ValueError(f"{FD_VARIABLE}={fd} is a socket bound to port {inherited.port}, but "
                         f"the store's port is {port} (ADAPTDL_MASTER_PORT): the launcher "
                         "must pass the socket it holds for that port")
    return inherited.detach()
