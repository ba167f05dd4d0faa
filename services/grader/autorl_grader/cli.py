"""`autorl grader`: serve the grading API."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autorl_grader.http_server import ConnectionLimits


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("grader", help="serve the grading API (settings from AUTORL_* variables)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="the agent API's port")
    parser.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="serve the admin API and metrics only on this port (the agent port then serves only the "
        "agent API); default: everything on --port",
    )
    parser.add_argument("--log-level", default="info")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, *, limits: ConnectionLimits | None = None) -> int:
    """Serve until stopped. ``limits``: what each connection may take (by default
    autorl.api.request_limits'; tests shorten them)."""
    import uvicorn

    from autorl.cli import UsageError
    from autorl.untrusted_text import log_printable_lines
    from autorl_grader.http_server import AnsweringH11Protocol, ConnectionLimits
    from autorl_grader.local_admin_token import with_local_admin_token
    from autorl_grader.main import create_app
    from autorl_grader.ports import AgentPortGuard
    from autorl_grader.settings import GraderSettings

    level = logging.getLevelName(args.log_level.upper())
    log_printable_lines(level if isinstance(level, int) else logging.INFO)  # its own events, one line each
    limits = limits or ConnectionLimits()
    if args.admin_port is not None:  # the agent port: new connections paced per address
        limits = dataclasses.replace(limits, paced_port=args.port)
    protocol = AnsweringH11Protocol.limited(limits)
    settings = with_local_admin_token(GraderSettings())
    if "public_url" not in settings.model_fields_set:  # agents reach this grader where it listens
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        shown = f"[{host}]" if ":" in host else host
        settings = settings.model_copy(update={"public_url": f"http://{shown}:{args.port}"})
    app = create_app(settings)
    # The client is the connection's peer, never what a request says of itself (X-Forwarded-For,
    # which uvicorn trusts from 127.0.0.1 by default): each address's fair share is keyed on it.
    options: dict[str, Any] = {"log_level": args.log_level, "http": protocol, "proxy_headers": False}
    if args.admin_port is None:
        uvicorn.run(app, host=args.host, port=args.port, **options)
        return 0
    if args.admin_port == args.port:
        raise UsageError(f"--admin-port must differ from --port ({args.port})")
    sockets = [_listen(args.host, port) for port in (args.port, args.admin_port)]
    server = uvicorn.Server(uvicorn.Config(AgentPortGuard(app, agent_port=args.port), **options))
    server.run(sockets=sockets)
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    return sock
