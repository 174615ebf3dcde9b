"""``python -m proxyinfra autopilot``: the command, run from the project
directory (docs/autopilot.md, "Running it").

    autopilot --stack NAME --discovery URL [--once] [--dry-run] [--interval S]
              [--log FILE] [--listen HOST:PORT] [--state FILE]
    autopilot pause --stack NAME [--state FILE]
    autopilot resume --stack NAME [--state FILE]

The discovery service's token comes from ``$DISCOVERY_TOKEN`` (never a flag:
it would show in `ps`). Exit status of ``--once``: 0 when every change went
through (or none was due), 1 when one failed, waited out its lock or the
signals could not be read, 2 for a bad config (each key by its path).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import getpass
import os
import signal
import socket
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TextIO

from proxyinfra.autopilot.feed import HttpSignals, SignalsError
from proxyinfra.autopilot.log import DecisionLog
from proxyinfra.autopilot.memory import MemoryFiles, StateFileError, default_path
from proxyinfra.autopilot.room import BackendRoom
from proxyinfra.autopilot.run import FAILED, Autopilot, Options
from proxyinfra.autopilot.seam import SystemClock
from proxyinfra.autopilot.status import Status, serve
from proxyinfra.stackfile import project_name

TOKEN_ENV = "DISCOVERY_TOKEN"


def add_command(commands: argparse._SubParsersAction[Any]) -> None:
    parser = commands.add_parser(
        "autopilot",
        help="recycle burned proxies and scale groups by demand, through Pulumi updates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", nargs="?", choices=("run", "pause", "resume"), default="run")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--discovery", metavar="URL", help="the discovery service (any replica)")
    parser.add_argument("--once", action="store_true", help="one round, then exit")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between rounds")
    parser.add_argument("--log", type=Path, help="append the decision log here (default: stdout)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="serve /status and /metrics")
    parser.add_argument(
        "--state", type=Path, help="the round state file (default: beside the stack's state)"
    )
    parser.add_argument(
        "--retry-cap", type=int, default=3, help="failed updates of a change per hour"
    )
    parser.add_argument(
        "--lock-timeout", type=float, default=3600.0, help="seconds to wait for another's lock"
    )
    parser.set_defaults(run=_main)


def _files(args: argparse.Namespace) -> MemoryFiles:
    project_dir = args.project_dir.resolve()
    path = args.state or default_path(project_dir, project_name(project_dir), args.stack)
    return MemoryFiles(path)


def _main(args: argparse.Namespace) -> int:
    files = _files(args)
    clock = SystemClock()
    if args.action == "pause":
        files.pause(clock.now(), f"{getpass.getuser()}@{socket.gethostname()}")
        print(
            f"autopilot paused for stack {args.stack} ({files.pause_path}): no change until resume"
        )
        return 0
    if args.action == "resume":
        was = files.resume()
        print(f"autopilot {'resumed' if was else 'was not paused'} for stack {args.stack}")
        return 0
    if not args.discovery:
        print("autopilot: --discovery URL is required to run", file=sys.stderr)
        return 2
    if args.listen and not _address(args.listen):
        print(f"autopilot: --listen {args.listen!r}: not HOST:PORT", file=sys.stderr)
        return 2
    with _output(args.log) as out, _one_per_stack(files) as taken:
        if not taken:
            print(
                f"autopilot: another autopilot runs on stack {args.stack} ({files.path})",
                file=sys.stderr,
            )
            return 1
        return _run(args, files, clock, out)


def _run(args: argparse.Namespace, files: MemoryFiles, clock: SystemClock, out: TextIO) -> int:
    # Imported here: the Automation API is needed only to run, not to pause.
    from proxyinfra.autopilot.automation import AutomationStack

    project_dir = args.project_dir.resolve()
    status = Status(args.stack)
    server = None
    if args.listen:
        host, port = _address(args.listen) or ("", 0)
        server = serve(status, host, port)
    log = DecisionLog(args.stack, clock.now, out)
    options = Options(
        project=project_name(project_dir),
        project_dir=project_dir,
        dry_run=args.dry_run,
        retry_cap=args.retry_cap,
        backoff=timedelta(minutes=1),
        lock_timeout=args.lock_timeout,
    )
    pilot = Autopilot(
        AutomationStack(project_dir, args.stack),
        HttpSignals(args.discovery, os.environ.get(TOKEN_ENV)),
        clock,
        log,
        files,
        status,
        options,
        room=BackendRoom(),
    )
    try:
        if args.once or args.dry_run:
            try:
                pilot.round()
            except (SignalsError, StateFileError) as error:
                log.write("round", result="error", error=str(error))
                print(f"autopilot: {error}", file=sys.stderr)
                return 1
            for line in pilot.failed:  # the decision log may be a file no one watches
                print(f"autopilot: {line}", file=sys.stderr)
            return 1 if set(pilot.results) & FAILED else 0
        signal.signal(signal.SIGTERM, lambda *_: pilot.stop())
        pilot.run(args.interval)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if server is not None:
            server.shutdown()


def _address(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


@contextlib.contextmanager
def _output(path: Path | None) -> Iterator[TextIO]:
    if path is None:
        yield sys.stdout
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        yield out


@contextlib.contextmanager
def _one_per_stack(files: MemoryFiles) -> Iterator[bool]:
    """An exclusive flock beside the state file for as long as this runs:
    two autopilots on one stack would race each other's plans."""
    lock_path = files.path.with_suffix(".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = lock_path.open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        handle.close()
