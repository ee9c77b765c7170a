"""The listening socket of a server, bound before the server starts, so port 0 (any free port) reports the port
it got; one module without the app or the model, so ``serve --workers``'s supervisor binds without loading them."""

from __future__ import annotations

import socket


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections made before uvicorn accepts wait in the backlog instead of being refused
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
