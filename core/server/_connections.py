"""The server side of each TCP connection, found by the client's address, so the app can cut it.

ASGI gives an app no handle on its connection, and hypercorn has no way for an app to drop one: an app that
stops mid-reply gets an HTTP/1.1 connection closed but an HTTP/2 stream left hanging, and an app that never
starts a reply gets a 500. A real dropped connection, and llama.cpp's close after a stream, need the socket.

The listening socket is a ``socket.socket`` subclass whose ``accept`` records each accepted socket under its
peer address (what hypercorn puts in ``scope["client"]``). ``cut`` shuts the socket down in both directions
(the client reads EOF; asyncio and hypercorn then close it the usual way); it never closes the file
descriptor, which the event loop owns. Entries are weak, so a closed connection leaves nothing behind.
"""

from __future__ import annotations

import socket
import weakref
from typing import Any

Peer = tuple[Any, ...]


class ConnectionRegistry:
    """Accepted sockets by peer address, and the connections marked to close at their next request."""

    def __init__(self) -> None:
        self._by_peer: weakref.WeakValueDictionary[Peer, socket.socket] = weakref.WeakValueDictionary()
        self._doomed: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def track(self, conn: socket.socket, address: Peer) -> None:
        """Remember ``conn`` under ``address`` (host, port, ...)."""
        self._by_peer[_key(address)] = conn

    def cut(self, peer: Peer | None) -> bool:
        """Shut down the connection from ``peer``; True if there was one to cut. Never raises."""
        conn = self._lookup(peer)
        if conn is None:
            return False
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:  # already gone: the client beat us to it
            return False
        return True

    def doom(self, peer: Peer | None) -> None:
        """Mark the connection from ``peer`` to be cut, unanswered, when its next request arrives."""
        conn = self._lookup(peer)
        if conn is not None:
            self._doomed.add(conn)

    def is_doomed(self, peer: Peer | None) -> bool:
        conn = self._lookup(peer)
        return conn is not None and conn in self._doomed

    def _lookup(self, peer: Peer | None) -> socket.socket | None:
        if not peer:
            return None
        conn = self._by_peer.get(_key(peer))
        if conn is None or conn.fileno() < 0:
            return None
        return conn


def _key(address: Peer) -> Peer:
    # IPv6 peers come as (host, port, flowinfo, scope_id); hypercorn's scope["client"] keeps (host, port).
    return (address[0], address[1])


class TrackingSocket(socket.socket):
    """A listening socket that reports every connection it accepts to a registry."""

    __slots__ = ("registry",)
    registry: (
        ConnectionRegistry  # set right after construction: socket.dup() calls the class with socket's args
    )

    def accept(self) -> tuple[socket.socket, Any]:
        conn, address = super().accept()
        # Small writes (a header block, one token) must leave at once: Nagle's algorithm would hold each one
        # for the client's delayed ACK, 40 ms a request.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.registry.track(conn, address)
        return conn, address
