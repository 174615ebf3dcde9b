"""ProxyDomain: the proxy's VM on a libvirt host.

Create checks the host's free memory, defines the domain from the declarative
builder, starts it and waits for its address (guest agent, then the DHCP
lease of a libvirt network, then ARP). Any failure removes what the create
made. Delete shuts down gracefully, then destroys, then undefines with NVRAM.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic

import libvirt
import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from providers.kvm import squidpush
from providers.kvm.access import HostAccess
from providers.kvm.addresses import (
    address_from_agent,
    address_from_arp,
    address_from_lease,
    lease_ip,
)
from providers.kvm.args import Change, Made, ResourceArgs, arg, is_unknown
from providers.kvm.capacity import domain_memory, free_memory
from providers.kvm.domainxml import (
    NS_URI,
    DomainInfo,
    DomainSpec,
    DomainType,
    Firmware,
    ProxyMetadata,
    build_domain_xml,
    format_rfc3339,
    parse_domain,
)
from providers.kvm.errors import CapacityError, KvmError
from providers.kvm.resource import KvmProvider
from providers.kvm.squidfiles import kept_outputs, seed_changes, squid_changed
from providers.kvm.trace import state_name
from providers.kvm.volumes import human
from proxyinfra.stacktrace import short_stack_trace

UNDEFINE_FLAGS = (
    libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
    | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
)
POLL_START, POLL_MAX = 1.0, 4.0
REPLACE, UPDATE = Change.REPLACE, Change.UPDATE


def mac_for(proxy_id: str) -> str:
    """A stable locally administered MAC in qemu's range, so the lease can be
    found by MAC without reading the domain back."""
    digest = hashlib.sha256(proxy_id.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


@dataclass(frozen=True)
class DomainArgs(ResourceArgs, Generic[Made]):
    """ProxyDomain's inputs. The names are fixed, so a replacement deletes first."""

    host: HostAccess = arg("host", REPLACE, HostAccess)
    name: str = arg("name", REPLACE, str)
    project: str = arg("project", UPDATE, str)  # metadata
    stack: str = arg("stack", UPDATE, str)  # metadata
    logical_name: str = arg("logicalName", UPDATE, str)  # metadata
    memory_mib: int = arg("memoryMib", REPLACE, int)
    vcpus: int = arg("vcpus", REPLACE, int)
    domain_type: DomainType = arg("domainType", REPLACE, str)
    cpu_mode: str = arg("cpuMode", REPLACE, str)
    firmware: Firmware = arg("firmware", REPLACE, str)
    disk_path: Made = arg("diskPath", REPLACE, str)
    seed_path: Made = arg("seedPath", REPLACE, str)
    base_volume: Made = arg("baseVolume", REPLACE, str)  # a new image: the overlay was replaced
    ip_timeout_seconds: int = arg("ipTimeoutSeconds", UPDATE, int)
    shutdown_timeout_seconds: int = arg("shutdownTimeoutSeconds", UPDATE, int)
    # The seed's content in two parts (providers/kvm/squidfiles.py): squid's
    # files, which a running domain takes in place, and the rest, which only
    # a new domain boots with; a state without it replaces on a new seed.
    seed_parts: Made | None = arg("seedParts", UPDATE, str, optional=True, default=None)
    # The seed's digest: what tells a state without the parts a new seed
    # (its outputs keep it only then: squidfiles.kept_outputs).
    seed_sha256: Made | None = arg("seedSha256", UPDATE, str, optional=True, default=None)


METADATA_KEYS = ("project", "stack", "logicalName")


def _spec(args: DomainArgs[str], created: datetime) -> DomainSpec:
    return DomainSpec(
        name=args.name,
        memory_mib=args.memory_mib,
        vcpus=args.vcpus,
        domain_type=args.domain_type,
        cpu_mode=args.cpu_mode,
        firmware=args.firmware,
        disk_path=args.disk_path,
        seed_path=args.seed_path,
        network=args.host.network,
        bridge=args.host.bridge,
        mac=mac_for(args.name),
        metadata=ProxyMetadata(
            project=args.project, stack=args.stack, name=args.logical_name, created=created
        ),
    )


def _domain_args(props: dict[str, Any]) -> DomainArgs[str]:
    return DomainArgs.from_props(props)


class ProxyDomainProvider(KvmProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        if any(is_unknown(v) for v in news.values()):
            return CheckResult(news, [])  # preview: paths come from resources not made yet
        try:
            _spec(_domain_args(news), datetime.now(UTC))
        except (ValueError, KeyError, TypeError) as error:
            return CheckResult(news, [CheckFailure("name", f"invalid domain: {error}")])
        return CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = DomainArgs.changed(olds, news, REPLACE)
        updates = DomainArgs.changed(olds, news, UPDATE)
        if is_unknown(news.get("seedPath")) and olds.get("seedPath"):
            # A preview of the seed's update: its path is its fixed name's in
            # the host's pool (a new pool shows in `host`), so it stays.
            replaces = [k for k in replaces if k != "seedPath"]
        replaces, updates = seed_changes(olds, news, replaces, updates)
        # Read back by refresh: a domain given another MAC out of band.
        name = news.get("name")
        if olds.get("mac") and isinstance(name, str) and olds["mac"] != mac_for(name):
            replaces.append("mac")
        # A refresh that found the domain stopped out of band: the declared
        # state is running, so the next up starts it (an update, in place).
        if olds.get("state", "running") != "running":
            updates.append("state")
        return DiffResult(
            changes=bool(replaces or updates),
            replaces=replaces,
            delete_before_replace=True,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        args = _domain_args(props)
        try:
            return self._create(props, args)
        except libvirt.libvirtError as error:
            # libvirt's own text ("End of file while reading data") names no host.
            error.add_note(
                f"{args.host.where}: domain {args.name}: the libvirt call failed; once the "
                "host is reachable again, `pulumi up` converges (a domain this run left "
                "behind is replaced)"
            )
            raise

    def _create(self, props: dict[str, Any], args: DomainArgs[str]) -> CreateResult:
        access = args.host
        log = self.logger(access, args.name)
        conn = self.connection(props).libvirt()
        memory = domain_memory(args.memory_mib)
        free = free_memory(conn)
        if memory > free:
            raise CapacityError(
                access.where,
                f"{human(free)} of memory free, domain {args.name} needs {human(memory)}",
                "stop other VMs, pick a smaller machineType or another host",
            )
        self._clear_leftover(conn, args, log)
        created = datetime.now(UTC).replace(microsecond=0)
        xml = build_domain_xml(_spec(args, created))
        dom = conn.defineXML(xml)
        try:
            dom.create()
            ip = self._started_address(conn, dom, args, log)
        except BaseException as error:
            try:
                self._remove(dom, 0.0)
            except libvirt.libvirtError as cleanup:  # never hides the first error
                error.add_note(f"{access.where}: domain {args.name} may remain: {cleanup}")
            raise
        outs = {
            **kept_outputs(props),
            "ip": ip,
            "mac": mac_for(args.name),
            "state": "running",
            "created": format_rfc3339(created),
        }
        return CreateResult(id_=args.name, outs=outs)

    def _clear_leftover(
        self, conn: Any, args: DomainArgs[str], log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        """A domain of this name that a killed run left (defined, maybe
        running, not in state): this stack's own, by its metadata, is removed
        so the create starts clean on the same overlay and seed; anyone
        else's is an error, and is not touched."""
        try:
            found = conn.lookupByName(args.name)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return
            raise
        meta = parse_domain(found.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).metadata
        if meta is None or (meta.project, meta.stack) != (args.project, args.stack):
            owner = f"project {meta.project!r}, stack {meta.stack!r}" if meta else "no metadata"
            raise KvmError(
                f"{args.host.where}: a domain named {args.name} exists and is not this "
                f"stack's ({owner}); it was left alone: rename or remove it "
                f"(virsh undefine --nvram {args.name}) if it is not needed"
            )
        log.warning(
            "domain %s was left by an interrupted run (created %s): replacing it",
            args.name,
            format_rfc3339(meta.created),
        )
        self._remove(found, 0.0)

    def _wait_for_ip(self, conn: Any, dom: Any, args: DomainArgs[str]) -> tuple[str, str]:
        """The address and where it came from: the agent first (knows the
        guest's own view), then the network's DHCP lease, then ARP (bridges
        only: the host's neighbour table)."""
        access = args.host
        timeout = float(args.ip_timeout_seconds)
        mac = mac_for(args.name)
        network = access.network or ""
        net = conn.networkLookupByName(network) if network else None
        deadline = time.monotonic() + timeout
        interval = POLL_START
        while True:
            found = address_from_agent(dom, mac) or (
                address_from_lease(net, mac, network)
                if net is not None
                else address_from_arp(dom, mac)
            )
            if found:
                return found
            if time.monotonic() + interval > deadline:
                source = (
                    f"network {access.network!r}" if access.network else f"bridge {access.bridge!r}"
                )
                raise KvmError(
                    f"{access.where}: domain {args.name} (MAC {mac}) got no IP address within "
                    f"{timeout:.0f}s on {source}; check DHCP there and the guest's boot "
                    f"(virsh console {args.name}); raise ipTimeoutSeconds for slow hosts"
                )
            time.sleep(interval)
            interval = min(interval * 1.5, POLL_MAX)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        """The domain as it is on the host: its state and address, and its
        definition read back, so memory, vCPUs, disks, NIC or metadata changed
        out of band show as changed inputs (refresh) that the next up repairs."""
        args = _domain_args(props)
        access = args.host
        conn = self.connection(props).libvirt()
        try:
            dom = conn.lookupByName(args.name)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return ReadResult(id_="", outs={})
            raise
        state = state_name(dom.state()[0])
        ip = props.get("ip")
        if state == "running" and access.network:
            net = conn.networkLookupByName(access.network)
            ip = lease_ip(net, mac_for(args.name)) or ip
        # The persistent definition: what the domain is, and boots as next.
        info = parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        outs = {**props, **read_back(info, props), "state": state, "ip": ip}
        return ReadResult(id_=id_, outs=outs)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        args = _domain_args(news)
        if any(olds.get(k) != news.get(k) for k in METADATA_KEYS):
            conn = self.connection(news).libvirt()
            dom = conn.lookupByName(args.name)
            created = datetime.fromisoformat(str(olds["created"]))
            meta = _spec(args, created).metadata
            dom.setMetadata(
                libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                meta.to_set_metadata_xml(),
                "ep",
                NS_URI,
                libvirt.VIR_DOMAIN_AFFECT_CONFIG
                | (libvirt.VIR_DOMAIN_AFFECT_LIVE if dom.isActive() else 0),
            )
        kept: dict[str, Any] = {k: olds[k] for k in ("ip", "mac", "state", "created") if k in olds}
        if olds.get("state", "running") != "running":
            kept |= self._start_again(args, news)
        elif squid_changed(olds, news):
            kept |= self._new_squid_settings(args, news)
        return UpdateResult(outs={**kept_outputs(news), **kept})

    def _new_squid_settings(self, args: DomainArgs[str], props: dict[str, Any]) -> dict[str, Any]:
        """Squid's new files into the running guest (providers/kvm/squidpush.py);
        without an agent that answers, a restart, at whose boot cloud-init
        applies the new seed."""
        log = self.logger(args.host, args.name)
        conn = self.connection(props).libvirt()
        dom = conn.lookupByName(args.name)
        try:
            squidpush.push(dom, squidpush.seed_files(conn, args.seed_path))
        except squidpush.NoAgent as error:
            log.warning(
                "the guest agent did not answer (%s): restarting the domain, whose next "
                "boot applies the new seed",
                error,
            )
            self._remove_running(dom, float(args.shutdown_timeout_seconds))
            dom.create()
            return {"ip": self._started_address(conn, dom, args, log), "state": "running"}
        log.info("squid's new settings applied in place through the guest agent")
        return {}

    def _start_again(self, args: DomainArgs[str], props: dict[str, Any]) -> dict[str, Any]:
        """Start a domain that was stopped out of band; wait for its address."""
        log = self.logger(args.host, args.name)
        conn = self.connection(props).libvirt()
        dom = conn.lookupByName(args.name)
        if not dom.isActive():
            log.info("domain was stopped out of band; starting it again")
            dom.create()
        return {"ip": self._started_address(conn, dom, args, log), "state": "running"}

    def _started_address(
        self,
        conn: Any,
        dom: Any,
        args: DomainArgs[str],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        """The address of a domain just started, logged with how long it took."""
        log.info("domain started; waiting up to %ss for its address", args.ip_timeout_seconds)
        started = time.monotonic()
        ip, source = self._wait_for_ip(conn, dom, args)
        log.info(
            "domain has address %s from %s after %.1fs", ip, source, time.monotonic() - started
        )
        return ip

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        args = _domain_args(props)
        conn = self.connection(props).libvirt()
        try:
            dom = conn.lookupByName(args.name)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return  # already gone: nothing to do
            raise
        self._remove(dom, float(args.shutdown_timeout_seconds))

    @staticmethod
    def _remove(dom: Any, shutdown_timeout: float) -> None:
        """Graceful shutdown up to the timeout, then destroy; undefine with NVRAM."""
        ProxyDomainProvider._remove_running(dom, shutdown_timeout)
        dom.undefineFlags(UNDEFINE_FLAGS)

    @staticmethod
    def _remove_running(dom: Any, shutdown_timeout: float) -> None:
        """Graceful shutdown up to the timeout, then destroy: the domain stays defined."""
        if dom.isActive():
            if shutdown_timeout > 0:
                with contextlib.suppress(libvirt.libvirtError):
                    dom.shutdown()
                deadline = time.monotonic() + shutdown_timeout
                while dom.isActive() and time.monotonic() < deadline:
                    time.sleep(0.5)
            if dom.isActive():
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()


def read_back(info: DomainInfo, props: dict[str, Any]) -> dict[str, Any]:
    """The inputs as the domain's definition has them, for the keys it shows.
    Equal values come back unchanged (so a refresh of an untouched domain
    changes nothing); a missing metadata element reads as None."""
    found: dict[str, Any] = {
        "memoryMib": info.memory_mib,
        "vcpus": info.vcpus,
        "domainType": info.domain_type,
        "cpuMode": info.cpu_mode,
        "firmware": info.firmware,
        "diskPath": info.disk_path,
        "seedPath": info.seed_path,
        "mac": info.mac,
    }
    meta = info.metadata
    found |= {
        "project": meta.project if meta else None,
        "stack": meta.stack if meta else None,
        "logicalName": meta.name if meta else None,
    }
    host = props.get("host")
    if isinstance(host, dict):  # the NIC: which network or bridge it is plugged into
        found["host"] = {**host, "network": info.network, "bridge": info.bridge}
    return {k: v for k, v in found.items() if not _same_value(props.get(k), v)}


def _same_value(old: Any, new: Any) -> bool:
    if isinstance(old, dict) and isinstance(new, dict):  # a key left out is None (HostAccess)
        return all((old.get(k) or None) == (new.get(k) or None) for k in old.keys() | new.keys())
    return bool(old == new)


class ProxyDomain(pulumi.dynamic.Resource):
    ip: pulumi.Output[str]
    mac: pulumi.Output[str]
    state: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: DomainArgs[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        outputs: dict[str, Any] = {"ip": None, "mac": None, "state": None, "created": None}
        fixed_name = pulumi.ResourceOptions(delete_before_replace=True)
        with short_stack_trace():
            super().__init__(
                ProxyDomainProvider(),
                name,
                {**args.to_props(), **outputs},
                pulumi.ResourceOptions.merge(opts, fixed_name),
            )
