"""``python -m proxyinfra``: operator commands that run outside the engine,
each added by the backend it belongs to (proxyinfra.registry), and the
autopilot, the core's own (proxyinfra/autopilot/command.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from proxyinfra import logs
from proxyinfra.autopilot.command import add_command as add_autopilot
from proxyinfra.registry import backends
from proxyinfra.validation import ConfigError


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="python -m proxyinfra",
        description="Operator commands beside `pulumi`, run from the project directory. "
        "Each takes --help.",
    )
    root.add_argument(
        "--project-dir", type=Path, default=Path.cwd(), help="where Pulumi.yaml is (default: .)"
    )
    commands = root.add_subparsers(dest="command", required=True)
    for backend in backends().values():
        backend.add_commands(commands)
    add_autopilot(commands)  # the core's own: it drives the stack, whatever its backends
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure()
    try:
        code: int = args.run(args)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    return code
