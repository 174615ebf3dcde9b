"""``python -m proxyinfra``: operator commands that run outside the engine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from proxyinfra import logs
from proxyinfra.config import KvmProviderEntry
from proxyinfra.stackfile import load_stack
from proxyinfra.validation import ConfigError


def _hosts_check(args: argparse.Namespace) -> int:
    from providers.kvm.access import HostAccess
    from providers.kvm.connection import connect
    from providers.kvm.hostcheck import check_host

    config = load_stack(args.project_dir, args.stack)
    rows = []
    for provider in config.providers.values():
        if not isinstance(provider, KvmProviderEntry):
            continue
        for host in provider.kvm.hosts:
            access = HostAccess.of(provider, host, config.base_dir)
            connection = connect(access)
            try:
                rows.extend(check_host(access, host.domain_type, connection))
            finally:
                connection.close()
    if not rows:
        print(f"no kvm hosts in Pulumi.{args.stack}.yaml")
        return 0
    width_host = max(len(r.host) for r in rows)
    width_check = max(len(r.check) for r in rows)
    for r in rows:
        status = "ok  " if r.ok else "FAIL"
        print(f"{r.host:<{width_host}}  {r.check:<{width_check}}  {status}  {r.detail}")
    failed = [r for r in rows if not r.ok]
    if failed:
        print(
            f"\n{len(failed)} check(s) failed: " + "; ".join(f"{r.host}: {r.check}" for r in failed)
        )
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m proxyinfra", description=__doc__)
    root.add_argument(
        "--project-dir", type=Path, default=Path.cwd(), help="where Pulumi.yaml is (default: .)"
    )
    commands = root.add_subparsers(dest="command", required=True)
    hosts = commands.add_parser("hosts", help="libvirt hosts")
    hosts_commands = hosts.add_subparsers(dest="hosts_command", required=True)
    check = hosts_commands.add_parser("check", help="check every libvirt host of a stack")
    check.add_argument("--stack", default="dev", help="stack name (default: dev)")
    check.set_defaults(run=_hosts_check)
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
