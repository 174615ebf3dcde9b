"""``python -m proxyinfra autopilot``: the command, run from the project
directory (docs/autopilot.md, "Running it").

    autopilot --stack NAME --discovery URL [--once] [--dry-run] [--interval S]
              [--log FILE] [--listen HOST:PORT] [--state FILE]
    autopilot pause --stack NAME [--state FILE]
    autopilot resume --stack NAME [--state FILE]

The discovery service's token comes from ``$DISCOVERY_TOKEN`` (never a flag:
it would show in `ps`). Exit status of ``--once``: 0 when every change went
through (or none was due), 1 when one failed, waited out its lock or the
signals could not be read or the stack could not be opened, 2 for a bad
argument (named with its value) or config (each key by its path).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import getpass
import math
import os
import signal
import socket
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from proxyinfra.autopilot.feed import HttpSignals, SignalsError
from proxyinfra.autopilot.log import DecisionLog, LogFile, Sink
from proxyinfra.autopilot.memory import MemoryFiles, StateFileError, default_path
from proxyinfra.autopilot.room import BackendRoom
from proxyinfra.autopilot.run import FAILED, Autopilot, Options
from proxyinfra.autopilot.seam import Stack, StackUnavailable, SystemClock
from proxyinfra.autopilot.statefile import stack_names
from proxyinfra.autopilot.status import Status, serve
from proxyinfra.stackfile import backend_dir, project_name, stack_name_error, stack_parts

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
    # The short name: `dev` and `organization/<project>/dev` are one stack, one state.
    short = stack_parts(args.stack)[1]
    path = args.state or default_path(project_dir, project_name(project_dir), short)
    return MemoryFiles(path)


def _bad_argument(args: argparse.Namespace) -> str | None:
    """The first argument that cannot work, named with its value; checked
    before anything is read or written."""
    bad_name = stack_name_error(args.stack)
    if bad_name is not None:
        return f"--stack {args.stack!r}: {bad_name}"
    if args.action != "run":
        return None
    if args.discovery is None:
        return "--discovery URL is required to run"
    url = urlsplit(args.discovery)
    if url.username is not None or url.password is not None:
        # Not echoed: the URL is in the decision log's lines, the password would be too.
        shown = url._replace(netloc="***@" + url.netloc.rpartition("@")[2]).geturl()
        return (
            f"--discovery {shown!r}: credentials in the URL would reach the decision log; "
            f"the service takes a bearer token, from ${TOKEN_ENV}"
        )
    try:
        port_ok = url.port is None or url.port > 0
    except ValueError:
        port_ok = False
    if url.scheme not in ("http", "https") or not url.hostname or not port_ok:
        return f"--discovery {args.discovery!r}: not an http:// or https:// URL with a host"
    if not (math.isfinite(args.interval) and args.interval > 0):
        return f"--interval {args.interval:g}: seconds between rounds, more than 0"
    if args.retry_cap < 1:
        return f"--retry-cap {args.retry_cap}: failed updates of a change per hour, at least 1"
    if not (math.isfinite(args.lock_timeout) and args.lock_timeout >= 0):
        return f"--lock-timeout {args.lock_timeout:g}: seconds, 0 or more"
    if args.listen and not _address(args.listen):
        return f"--listen {args.listen!r}: not HOST:PORT"
    return None


def _other_project(args: argparse.Namespace) -> str | None:
    """A qualified stack name of another project: this project's program
    cannot update it, nor its round state be kept under this project."""
    named = stack_parts(args.stack)[0]
    project = project_name(args.project_dir.resolve())
    if named is None or named == project:
        return None
    return f"--stack {args.stack!r}: names project {named!r}, but this project is {project!r}"


def _unknown_stack(args: argparse.Namespace) -> str | None:
    """On a file backend, a stack it does not hold, named with the ones it
    does; None elsewhere (no cheap way to tell: `run` finds out)."""
    project_dir = args.project_dir.resolve()
    root = backend_dir(project_dir)
    if root is None:
        return None
    names = stack_names(root, project_name(project_dir))
    if names is None or stack_parts(args.stack)[1] in names:
        return None
    return f"--stack {args.stack!r}: no such stack in {root} (its stacks: {', '.join(names) or 'none'})"


def _main(args: argparse.Namespace) -> int:
    # A typo in `pause` would pause nothing, and say it had: the stack is looked up.
    bad = (
        _bad_argument(args)
        or _other_project(args)
        or (_unknown_stack(args) if args.action != "run" else None)
    )
    if bad is not None:
        print(f"autopilot: {bad}", file=sys.stderr)
        return 2
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
    try:
        output = _output(args.log)
    except OSError as error:
        why = f"{error.strerror}: {error.filename}" if error.filename else str(error)
        print(f"autopilot: --log {str(args.log)!r}: cannot be written ({why})", file=sys.stderr)
        return 2
    # Imported here: the Automation API is needed only to run, not to pause.
    from proxyinfra.autopilot.automation import AutomationStack

    log = DecisionLog(args.stack, clock.now, output)
    try:  # before the lock: a stack that cannot be opened leaves nothing
        stack = AutomationStack(args.project_dir.resolve(), args.stack)
    except StackUnavailable as error:
        log.write("round", result="error", error=str(error))
        print(f"autopilot: {error}", file=sys.stderr)
        return 1
    with _one_per_stack(files) as taken:
        if not taken:
            print(
                f"autopilot: another autopilot runs on stack {args.stack} ({files.path})",
                file=sys.stderr,
            )
            return 1
        return _run(args, stack, files, clock, log)


def _run(
    args: argparse.Namespace,
    stack: Stack,
    files: MemoryFiles,
    clock: SystemClock,
    log: DecisionLog,
) -> int:
    project_dir = args.project_dir.resolve()
    status = Status(args.stack)
    options = Options(
        project=project_name(project_dir),
        project_dir=project_dir,
        dry_run=args.dry_run,
        retry_cap=args.retry_cap,
        backoff=timedelta(minutes=1),
        lock_timeout=args.lock_timeout,
    )
    server = None
    if args.listen:
        host, port = _address(args.listen) or ("", 0)
        try:
            server = serve(status, host, port)
        except OSError as error:
            print(
                f"autopilot: --listen {args.listen!r}: {error.strerror or error}", file=sys.stderr
            )
            return 2
    pilot = Autopilot(
        stack,
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
            except (SignalsError, StateFileError, StackUnavailable) as error:
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


def _output(path: Path | None) -> Sink:
    """Where the decision log goes, checked now: a path that cannot be
    written is named before anything else runs."""
    return sys.stdout if path is None else LogFile(path)


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
