"""`autorl grader`: serve the grading API."""

from __future__ import annotations

import argparse
import dataclasses
import errno
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
    parser.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS)
    parser.set_defaults(func=run)


#: uvicorn's log levels.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def run(args: argparse.Namespace, *, limits: ConnectionLimits | None = None) -> int:
    """Serve until stopped. ``limits``: what each connection may take (by default
    autorl.api.request_limits'; tests shorten them)."""
    import uvicorn

    from autorl.cli import UsageError, check_port
    from autorl.untrusted_text import log_printable_lines
    from autorl_grader.http_server import AnsweringH11Protocol, ConnectionLimits
    from autorl_grader.local_admin_token import with_local_admin_token
    from autorl_grader.main import create_app
    from autorl_grader.ports import AgentPortGuard
    from autorl_grader.settings import GraderSettings

    check_port("--port", args.port)
    if args.admin_port is not None:
        check_port("--admin-port", args.admin_port)
        if args.admin_port == args.port:
            raise UsageError(f"--admin-port must differ from --port ({args.port})")
    level = logging.getLevelName(args.log_level.upper())
    log_printable_lines(level if isinstance(level, int) else logging.INFO)  # its own events, one line each
    limits = limits or ConnectionLimits()
    if args.admin_port is not None:  # the agent port: new connections paced per address
        limits = dataclasses.replace(limits, paced_port=args.port)
    protocol = AnsweringH11Protocol.limited(limits)
    # Both ports are bound before anything starts: one that cannot be is refused as bad input.
    sockets = [_listen(args.host, args.port, "--port")]
    try:
        if args.admin_port is not None:
            sockets.append(_listen(args.host, args.admin_port, "--admin-port"))
        settings = with_local_admin_token(GraderSettings())
        if "public_url" not in settings.model_fields_set:  # agents reach this grader where it listens
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
            shown = f"[{host}]" if ":" in host else host
            settings = settings.model_copy(update={"public_url": f"http://{shown}:{args.port}"})
        app = create_app(settings)
        # Before serving, where a store that cannot be used is a message, not uvicorn's traceback.
        app.state.grader.db.wait_until_ready()
        # The client is the connection's peer, never what a request says of itself (X-Forwarded-For,
        # which uvicorn trusts from 127.0.0.1 by default): each address's fair share is keyed on it.
        options: dict[str, Any] = {"log_level": args.log_level, "http": protocol, "proxy_headers": False}
        served = app if args.admin_port is None else AgentPortGuard(app, agent_port=args.port)
        server = uvicorn.Server(
            uvicorn.Config(served, host=args.host or "0.0.0.0", port=args.port, **options)
        )
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
    return 0


def _listen(host: str, port: int, flag: str) -> socket.socket:
    """A socket bound to ``host``:``port`` (any address where ``host`` is empty); one that cannot be
    bound is a :class:`UsageError` naming ``flag`` or --host, whichever is wrong, and the fix."""
    from autorl.cli import UsageError

    shown = f"[{host}]" if ":" in host else host or "*"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as exc:  # a name that does not resolve, or is no name at all
        raise UsageError(f"--host {host!r} is not an address of this machine ({exc}); {_VALID_HOST}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UsageError(
                f"--host {host!r} is not an address of this machine ({exc.strerror}); {_VALID_HOST}"
            ) from exc
        raise UsageError(
            f"cannot listen on {shown}:{port} for {flag} ({exc.strerror or exc}); pick a free {flag}"
        ) from exc
    return sock


_VALID_HOST = "pass --host an address of this machine, such as 127.0.0.1 (this machine only) or 0.0.0.0 (all)"
