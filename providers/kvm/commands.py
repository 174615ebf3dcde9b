"""The kvm backend's operator commands under ``python -m proxyinfra``:
``hosts check`` and ``gc`` (they talk to the hosts, outside the engine)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from providers.kvm.access import HostAccess
from providers.kvm.config import KvmHost, KvmProviderEntry
from providers.kvm.connection import HostConnection, connect
from proxyinfra.config import StackConfig
from proxyinfra.stackfile import (
    load_stack,
    project_name,
    stack_argument,
    stack_file,
    stack_parts,
)


def _kvm_hosts(config: StackConfig) -> Iterator[tuple[KvmHost, HostAccess, HostConnection]]:
    """Every kvm host of the stack with its access settings and a connection,
    closed when the caller moves on to the next host."""
    for provider in config.providers.values():
        if not isinstance(provider, KvmProviderEntry):
            continue
        for host in provider.kvm.hosts:
            access = HostAccess.of(provider, host, config.base_dir)
            connection = connect(access)
            try:
                yield host, access, connection
            finally:
                connection.close()


def _hosts_check(args: argparse.Namespace) -> int:
    from providers.kvm.hostcheck import check_host

    config = load_stack(args.project_dir, args.stack)
    rows = []
    for host, access, connection in _kvm_hosts(config):
        rows.extend(check_host(access, host.domain_type, connection))
    if not rows:
        print(f"no kvm hosts in {stack_file(args.project_dir, args.stack).name}")
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


def _gc(args: argparse.Namespace) -> int:
    from providers.kvm.gc import find_orphans, find_unused_bases, remove
    from providers.kvm.state import load_state, owned_objects, parse_duration
    from proxyinfra.names import proxy_id

    try:
        min_age = parse_duration(args.min_age)
    except ValueError as error:
        print(f"--min-age: {error}", file=sys.stderr)
        return 2
    config = load_stack(args.project_dir, args.stack)
    project = project_name(args.project_dir)
    owned = owned_objects(load_state(args.project_dir, project, args.stack, args.state))
    # The objects' marks and ids carry the short name (`org/project/dev` is `dev`).
    short = stack_parts(args.stack)[1]
    logical = {r.name for r in config.replicas()} | owned.logical_names
    stack_ids = {proxy_id(project, short, name) for name in logical}
    found = 0
    for _, access, connection in _kvm_hosts(config):
        conn = connection.libvirt()
        orphans = find_orphans(conn, access, project, short, owned.names, stack_ids, min_age)
        if args.bases:
            orphans += find_unused_bases(conn, access, owned.names, min_age)
        for o in orphans:
            age = f"{o.age_seconds / 60:.0f}m" if o.age_seconds is not None else "?"
            print(f"{o.host}  {o.kind:<6}  {o.name}  age {age}  {o.detail}")
        if orphans and args.delete:
            remove(conn, access, orphans)
        found += len(orphans)
    if not found:
        print(f"no orphans of stack {args.stack!r} older than {args.min_age}")
    elif args.delete:
        print(f"removed {found} object(s)")
    else:
        print(
            f"dry run: {found} object(s) would be removed; run again with --delete to remove them"
        )
    return 0


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    hosts = commands.add_parser("hosts", help="libvirt hosts")
    hosts_commands = hosts.add_subparsers(dest="hosts_command", required=True)
    check = hosts_commands.add_parser("check", help="check every libvirt host of a stack")
    check.add_argument(
        "--stack", default="dev", type=stack_argument, help="stack name (default: dev)"
    )
    check.set_defaults(run=_hosts_check)
    gc = commands.add_parser(
        "gc", help="list (and remove) objects on the hosts the stack's state does not own"
    )
    gc.add_argument("--stack", default="dev", type=stack_argument, help="stack name (default: dev)")
    gc.add_argument(
        "--min-age",
        default="1h",
        help="only objects at least this old (default: 1h; e.g. 0, 30m, 2d)",
    )
    gc.add_argument("--delete", action="store_true", help="remove them (default: dry run)")
    gc.add_argument(
        "--bases",
        action="store_true",
        help="also cached base images nothing backs onto (any stack's: the next `up` "
        "that needs one downloads it again)",
    )
    gc.add_argument(
        "--state",
        type=Path,
        help="the stack's state (`pulumi stack export` output); default: ask pulumi, else the file backend's checkpoint",
    )
    gc.set_defaults(run=_gc)
