"""`python -m discovery serve ...`: the companion service (docs/discovery.md).

    python -m discovery serve --fleet FILE --listen HOST:PORT --db PATH
        [--probe-target HOST:PORT ...] [--probe-interval SECONDS] [--lease-cooldown SECONDS]
        [--max-lease-ttl SECONDS] [--health-workers N] [--allow-remote-without-token]
    python -m discovery serve --stack NAME ...       (runs `pulumi stack output` itself)
    python -m discovery serve --stack site-a --stack site-b ...   (several stacks as one fleet)

The bearer token comes from the environment (DISCOVERY_TOKEN), never from the
command line, where every user of the machine could read it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from discovery import logs
from discovery.book.errors import StoreError
from discovery.database import Database, DatabaseError, parse_database
from discovery.fleet import FleetError
from discovery.logs import event
from discovery.settings import (
    DEFAULT_PROBE_TARGET,
    GatewaySettings,
    Network,
    Settings,
    is_loopback,
    split_host_port,
)
from health.targets import given_twice

if TYPE_CHECKING:
    from discovery.service import Service

log = logging.getLogger("discovery")

TOKEN_ENV = "DISCOVERY_TOKEN"
# Guessing is braked per client address and, past a rate of failures over all
# addresses, for every address that did not present the token lately
# (discovery/brake.py); a token this long is out of reach of any guessing rate.
MIN_TOKEN_LENGTH = 16
STACK_REFRESH_ENV = "DISCOVERY_STACK_REFRESH_SECONDS"
# The store from the environment, as the token: a URL with a password (from a
# Kubernetes Secret) on no command line and in no pod spec.
DB_ENV = "DISCOVERY_DB"
GRACEFUL_SHUTDOWN_S = 10


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _non_negative(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return _positive(text)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


def _host_port(text: str) -> tuple[str, int]:
    try:
        return split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m discovery", description=__doc__.split("\n")[0])
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the lease service",
        description="Run the discovery service: health-probe the fleet and lease proxies to crawlers. "
        f"Bearer token from ${TOKEN_ENV} (at least {MIN_TOKEN_LENGTH} characters).",
    )
    serve.add_argument(
        "--fleet",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="the manifest, or the output of `pulumi stack output --json --show-secrets`; "
        "re-read when it changes and on SIGHUP. Repeat it (and --stack) to serve several "
        "stacks as one fleet: names become STACK/NAME",
    )
    serve.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar="NAME",
        help="run `pulumi stack output fleet --json --show-secrets --stack NAME` (in the current "
        f"directory) at start, on SIGHUP and every ${STACK_REFRESH_ENV} seconds (default 60)",
    )
    serve.add_argument("--listen", required=True, type=_host_port, metavar="HOST:PORT")
    serve.add_argument(
        "--db",
        type=_database,
        metavar="PATH|URL",
        help="the lease store: an SQLite file (one service), or postgresql://USER@HOST:PORT/DB "
        f"shared by several replicas (password in the URL or $PGPASSWORD); default ${DB_ENV}",
    )
    serve.add_argument(
        "--probe-target",
        dest="probe_targets",
        action="append",
        type=_host_port,
        metavar="HOST:PORT",
        help="what each health probe CONNECTs to through the proxy; repeat it for fallbacks, "
        "tried in turn when a proxy cannot reach one, so that one target down does not read "
        f"as the whole fleet down (default {DEFAULT_PROBE_TARGET})",
    )
    serve.add_argument("--probe-interval", type=_positive, default=10.0, metavar="SECONDS")
    serve.add_argument(
        "--lease-cooldown",
        type=_non_negative,
        default=600.0,
        metavar="SECONDS",
        help="how long a proxy reported `blocked` is not leased (for that target, or at all); default 600",
    )
    serve.add_argument(
        "--max-lease-ttl",
        type=_positive,
        default=300.0,
        metavar="SECONDS",
        help="the default and the cap of a lease's TTL; default 300",
    )
    serve.add_argument("--health-workers", type=_count, default=256, metavar="N")
    _gateway_arguments(serve)
    serve.add_argument(
        "--allow-remote-without-token",
        action="store_true",
        help=f"listen on a non-loopback address although ${TOKEN_ENV} is not set (anyone who "
        "reaches the port can then take proxies and their credentials)",
    )
    return root


def _network(text: str) -> Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an address or a network (CIDR)"
        ) from None


def _gateway_arguments(serve: argparse.ArgumentParser) -> None:
    defaults = GatewaySettings("", 0)
    group = serve.add_argument_group("gateway", "one proxy URL for every client (docs/gateway.md)")
    group.add_argument(
        "--gateway",
        type=_host_port,
        metavar="HOST:PORT",
        help="open an HTTP forward proxy here that leases for its clients "
        "(user HOLDER[-session-ID], password a discovery token)",
    )
    group.add_argument(
        "--gateway-allow",
        type=_network,
        action="append",
        default=[],
        metavar="CIDR",
        help="admit clients from this network without credentials (a browser's --proxy-server); "
        "repeatable; none by default",
    )
    group.add_argument(
        "--gateway-idle",
        type=_positive,
        default=defaults.idle_release,
        metavar="SECONDS",
        help=f"release a session's or site's lease unused this long (default {defaults.idle_release:g})",
    )
    group.add_argument(
        "--gateway-site-leases",
        type=_count,
        default=defaults.per_site,
        metavar="N",
        help=f"leases held per holder and site without a session (default {defaults.per_site})",
    )
    group.add_argument(
        "--gateway-holder-leases",
        type=_count,
        default=defaults.holder_leases,
        metavar="N",
        help=f"leases one holder may hold through the gateway (default {defaults.holder_leases})",
    )
    group.add_argument(
        "--gateway-max-tunnels",
        type=_count,
        default=defaults.max_tunnels,
        metavar="N",
        help=f"open tunnels at once (default {defaults.max_tunnels})",
    )
    group.add_argument(
        "--gateway-holder-tunnels",
        type=_count,
        default=defaults.holder_tunnels,
        metavar="N",
        help=f"open tunnels of one holder (default {defaults.holder_tunnels})",
    )
    group.add_argument(
        "--gateway-tunnel-idle",
        type=_positive,
        default=defaults.tunnel_idle,
        metavar="SECONDS",
        help=f"close a tunnel that moved nothing this long (default {defaults.tunnel_idle:g})",
    )
    group.add_argument(
        "--gateway-answer-timeout",
        type=_positive,
        default=defaults.answer_timeout,
        metavar="SECONDS",
        help="answer 504 when a proxy sends no answer this long after it took a request "
        f"(default {defaults.answer_timeout:g})",
    )


def _gateway_settings(args: argparse.Namespace) -> GatewaySettings | None:
    if args.gateway is None:
        if args.gateway_allow:
            raise ValueError("--gateway-allow needs --gateway HOST:PORT")
        return None
    host, port = args.gateway
    return GatewaySettings(
        host,
        port,
        allow=tuple(args.gateway_allow),
        per_site=args.gateway_site_leases,
        idle_release=args.gateway_idle,
        holder_leases=args.gateway_holder_leases,
        max_tunnels=args.gateway_max_tunnels,
        holder_tunnels=args.gateway_holder_tunnels,
        tunnel_idle=args.gateway_tunnel_idle,
        answer_timeout=args.gateway_answer_timeout,
    )


def settings_from(args: argparse.Namespace, environ: dict[str, str]) -> Settings:
    """Settings from parsed arguments and the environment; ValueError on a refusal."""
    token = environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        # The message names the variable and the rule, never the value.
        raise ValueError(
            f"{TOKEN_ENV} is shorter than {MIN_TOKEN_LENGTH} characters: set a longer random "
            "token (e.g. `openssl rand -hex 32`)"
        )
    if not args.fleet and not args.stack:
        raise ValueError("give the fleet: --fleet FILE or --stack NAME (either may be repeated)")
    db = args.db
    if db is None:
        if not environ.get(DB_ENV):
            raise ValueError(f"give the lease store: --db PATH|URL or ${DB_ENV}")
        try:
            db = parse_database(environ[DB_ENV])
        except DatabaseError as error:
            raise ValueError(f"{DB_ENV}: {str(error).removeprefix('--db ')}") from None
    host, port = args.listen
    if token is None and not is_loopback(host) and not args.allow_remote_without_token:
        raise ValueError(
            f"refusing to listen on {host} without a token: set {TOKEN_ENV}, listen on "
            "127.0.0.1, or pass --allow-remote-without-token"
        )
    gateway = _gateway_settings(args)
    if (
        gateway is not None
        and token is None
        and not is_loopback(gateway.host)
        and not args.allow_remote_without_token
    ):
        raise ValueError(
            f"refusing to open the gateway on {gateway.host} without a token: set {TOKEN_ENV}, "
            "use a loopback address, or pass --allow-remote-without-token"
        )
    refresh_text = environ.get(STACK_REFRESH_ENV, "60")
    try:
        refresh = _positive(refresh_text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{STACK_REFRESH_ENV}: {exc}") from None
    probe_targets = tuple(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        for host, port in args.probe_targets or [split_host_port(DEFAULT_PROBE_TARGET)]
    )
    twice = given_twice(probe_targets)
    if twice is not None:
        raise ValueError(f"--probe-target {twice} is given twice")
    return Settings(
        listen_host=host,
        listen_port=port,
        db=db,
        fleet_files=tuple(args.fleet),
        stacks=tuple(args.stack),
        probe_targets=probe_targets,
        probe_interval=args.probe_interval,
        lease_cooldown=args.lease_cooldown,
        max_lease_ttl=args.max_lease_ttl,
        health_workers=args.health_workers,
        token=token,
        allow_remote_without_token=args.allow_remote_without_token,
        stack_refresh=refresh,
        gateway=gateway,
    )


def _database(value: str) -> Database:
    try:
        return parse_database(value)
    except DatabaseError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--db ")) from None


def serve(settings: Settings) -> int:
    from discovery.service import Service

    service = Service(settings)  # its store as `--db` says (make_backend)
    try:
        service.open()
    except (StoreError, FleetError) as exc:
        event(log, logging.ERROR, "cannot start", error=str(exc))
        return 1
    return run_server(service)


def run_server(service: Service) -> int:
    """Serves the API of an opened service with uvicorn (one worker) until SIGTERM or SIGINT."""
    import uvicorn  # imported here: `--help` and argument errors stay fast

    from discovery import connections, heap
    from discovery.app import create_app

    settings = service.settings
    # Client connections are capped below the descriptor limit, so that the
    # health probes always have descriptors (discovery/connections.py).
    fd_limit, _ = connections.raise_fd_limit()
    guard = connections.ConnectionGuard(
        max_connections=connections.connection_cap(fd_limit, settings.health_workers),
        registry=service.registry,
    )
    connections.quiet_cancellations()
    config = uvicorn.Config(
        create_app(service),
        host=settings.listen_host,
        port=settings.listen_port,
        http=connections.protocol_class(guard),
        timeout_keep_alive=connections.KEEP_ALIVE,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=4096,
    )
    server = uvicorn.Server(config)

    # uvicorn re-raises the signal that stopped it once it has shut down
    # gracefully; with the default disposition that would end the process
    # "killed by SIGTERM". A handler of our own makes a clean stop exit 0.
    # It is also the handler until uvicorn puts its own in place, as it
    # starts: a signal then stops the server once it has started (it would
    # otherwise be lost, and the service run on).
    def stopped(signum: int, _: FrameType | None) -> None:
        event(log, logging.INFO, "stopped by signal", signal=signal.Signals(signum).name)
        server.should_exit = True

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    event(
        log,
        logging.INFO,
        "starting",
        listen=f"{settings.listen_host}:{settings.listen_port}",
        db=str(settings.db),
        auth="bearer" if settings.token else "none",
        max_lease_ttl=settings.max_lease_ttl,
        lease_cooldown=settings.lease_cooldown,
        probe_targets=list(settings.probe_targets),
        probe_interval=settings.probe_interval,
        fd_limit=fd_limit,
        max_connections=guard.max_connections,
    )
    service.settle_heap = heap.settle  # once started, and after each fleet change
    try:
        server.run()
    except SystemExit as exc:  # uvicorn's way to fail a start (port taken: 3); ours is 1
        return 1 if exc.code else 0
    finally:
        service.close()  # no-op after a clean stop; frees the store otherwise
    return 0 if server.started else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args, dict(os.environ))
    except ValueError as exc:
        print(f"discovery: {exc}", file=sys.stderr)
        return 2
    # The token stays in this process's memory only: the pulumi subprocess and
    # anything else started from here must not inherit it.
    os.environ.pop(TOKEN_ENV, None)
    os.environ.pop(DB_ENV, None)
    logs.configure(secrets=(settings.token,) if settings.token else ())
    return serve(settings)
