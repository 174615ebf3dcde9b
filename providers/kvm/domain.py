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
from datetime import UTC, datetime
from typing import Any

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

from providers.kvm.access import HostAccess
from providers.kvm.domainxml import NS_URI, DomainSpec, ProxyMetadata, build_domain_xml
from providers.kvm.errors import CapacityError, KvmError
from providers.kvm.resource import KvmProvider
from providers.kvm.rules import DEFAULT_CPU_MODE, DEFAULT_DOMAIN_TYPE, DEFAULT_FIRMWARE
from providers.kvm.trace import state_name
from providers.kvm.volumes import human

# Inputs whose change needs a new VM; the names are fixed, so delete first.
REPLACE_KEYS = (
    "host",
    "name",
    "memoryMib",
    "vcpus",
    "domainType",
    "cpuMode",
    "firmware",
    "diskPath",
    "seedPath",
    "baseVolume",  # a new image: the overlay below was replaced
    "seedSha256",  # new user-data: cloud-init must see a new seed
)
UPDATE_KEYS = ("logicalName", "ipTimeoutSeconds", "shutdownTimeoutSeconds")

UNDEFINE_FLAGS = (
    libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
    | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
)
AGENT = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT
ARP = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP
POLL_START, POLL_MAX = 1.0, 4.0
MIB = 1024 * 1024


def mac_for(proxy_id: str) -> str:
    """A stable locally administered MAC in qemu's range, so the lease can be
    found by MAC without reading the domain back."""
    digest = hashlib.sha256(proxy_id.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def _spec(props: dict[str, Any], created: datetime) -> DomainSpec:
    network = props.get("network") or None
    bridge = props.get("bridge") or None
    return DomainSpec(
        name=props["name"],
        memory_mib=int(props["memoryMib"]),
        vcpus=int(props["vcpus"]),
        domain_type=props.get("domainType", DEFAULT_DOMAIN_TYPE),
        cpu_mode=props.get("cpuMode", DEFAULT_CPU_MODE),
        firmware=props.get("firmware", DEFAULT_FIRMWARE),
        disk_path=props["diskPath"],
        seed_path=props["seedPath"],
        network=network,
        bridge=bridge,
        mac=mac_for(props["name"]),
        serial_log=props.get("serialLog") or None,
        metadata=ProxyMetadata(
            project=props["project"],
            stack=props["stack"],
            name=props["logicalName"],
            created=created,
        ),
    )


class ProxyDomainProvider(KvmProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        if any(isinstance(v, pulumi.output.Unknown) for v in news.values()):
            return CheckResult(news, [])  # preview: paths come from resources not made yet
        try:
            _spec(news, datetime.now(UTC))
        except (ValueError, KeyError, TypeError) as error:
            failures.append(CheckFailure("name", f"invalid domain: {error}"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in REPLACE_KEYS if olds.get(k) != news.get(k)]
        updates = [k for k in UPDATE_KEYS if olds.get(k) != news.get(k)]
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
        access = self.access(props)
        log = self.logger(access, props["name"])
        conn = self.connection(props).libvirt()
        memory = int(props["memoryMib"]) * MIB
        free = conn.getFreeMemory()
        if memory > free:
            raise CapacityError(
                access.where,
                f"{human(free)} of memory free, domain {props['name']} needs {human(memory)}",
                "stop other VMs, pick a smaller machineType or another host",
            )
        created = datetime.now(UTC).replace(microsecond=0)
        xml = build_domain_xml(_spec(props, created))
        dom = conn.defineXML(xml)
        try:
            dom.create()
            ip = self._started_address(conn, dom, access, props, log)
        except BaseException:
            self._remove(dom, 0.0)
            raise
        outs = {
            **props,
            "ip": ip,
            "mac": mac_for(props["name"]),
            "state": "running",
            "created": created.isoformat().replace("+00:00", "Z"),
        }
        return CreateResult(id_=props["name"], outs=outs)

    def _wait_for_ip(self, conn: Any, dom: Any, access: HostAccess, props: dict[str, Any]) -> str:
        """Agent first (knows the guest's own view), then the network's DHCP
        lease, then ARP (bridges only: the host's neighbour table)."""
        timeout = float(props["ipTimeoutSeconds"])
        mac = mac_for(props["name"])
        net = conn.networkLookupByName(access.network) if access.network else None
        deadline = time.monotonic() + timeout
        interval = POLL_START
        while True:
            ip = _address_from_agent(dom, mac) or (
                _address_from_lease(net, mac) if net is not None else _address_from_arp(dom, mac)
            )
            if ip:
                return ip
            if time.monotonic() + interval > deadline:
                source = (
                    f"network {access.network!r}" if access.network else f"bridge {access.bridge!r}"
                )
                raise KvmError(
                    f"{access.where}: domain {props['name']} (MAC {mac}) got no IP address within "
                    f"{timeout:.0f}s on {source}; check DHCP there and the guest's boot "
                    f"(virsh console {props['name']}); raise ipTimeoutSeconds for slow hosts"
                )
            time.sleep(interval)
            interval = min(interval * 1.5, POLL_MAX)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        access = self.access(props)
        conn = self.connection(props).libvirt()
        try:
            dom = conn.lookupByName(props["name"])
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return ReadResult(id_="", outs={})
            raise
        state = state_name(dom.state()[0])
        ip = props.get("ip")
        if state == "running" and access.network:
            net = conn.networkLookupByName(access.network)
            ip = _address_from_lease(net, mac_for(props["name"])) or ip
        return ReadResult(id_=id_, outs={**props, "state": state, "ip": ip})

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if olds.get("logicalName") != news.get("logicalName"):
            conn = self.connection(news).libvirt()
            dom = conn.lookupByName(news["name"])
            created = datetime.fromisoformat(str(olds["created"]).replace("Z", "+00:00"))
            meta = _spec(news, created).metadata
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
            kept |= self._start_again(news)
        return UpdateResult(outs={**news, **kept})

    def _start_again(self, props: dict[str, Any]) -> dict[str, Any]:
        """Start a domain that was stopped out of band; wait for its address."""
        access = self.access(props)
        log = self.logger(access, props["name"])
        conn = self.connection(props).libvirt()
        dom = conn.lookupByName(props["name"])
        if not dom.isActive():
            log.info("domain was stopped out of band; starting it again")
            dom.create()
        return {"ip": self._started_address(conn, dom, access, props, log), "state": "running"}

    def _started_address(
        self,
        conn: Any,
        dom: Any,
        access: HostAccess,
        props: dict[str, Any],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        """The address of a domain just started, logged with how long it took."""
        log.info(
            "domain started; waiting up to %ss for its address", int(props["ipTimeoutSeconds"])
        )
        started = time.monotonic()
        ip = self._wait_for_ip(conn, dom, access, props)
        log.info("domain has address %s after %.1fs", ip, time.monotonic() - started)
        return ip

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        conn = self.connection(props).libvirt()
        try:
            dom = conn.lookupByName(props["name"])
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return  # already gone: nothing to do
            raise
        self._remove(dom, float(props.get("shutdownTimeoutSeconds", 60)))

    @staticmethod
    def _remove(dom: Any, shutdown_timeout: float) -> None:
        """Graceful shutdown up to the timeout, then destroy; undefine with NVRAM."""
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
        dom.undefineFlags(UNDEFINE_FLAGS)


def _first_ipv4(interfaces: dict[str, Any], mac: str) -> str | None:
    for iface in interfaces.values():
        if (iface.get("hwaddr") or "").lower() != mac:
            continue
        for addr in iface.get("addrs") or []:
            if addr.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4:
                return str(addr["addr"])
    return None


class DomainStopped(KvmError):
    pass


def _address_from_agent(dom: Any, mac: str) -> str | None:
    """Also the liveness check of the wait (no extra RPC): asking the agent of a
    domain that is not running fails with OPERATION_INVALID."""
    try:
        return _first_ipv4(dom.interfaceAddresses(AGENT, 0), mac)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID:
            raise DomainStopped(
                f"domain {dom.name()} stopped while booting: {error.get_error_message()}"
            ) from None
        return None  # no agent (yet): fall through to the other sources


def _address_from_lease(net: Any, mac: str) -> str | None:
    for lease in net.DHCPLeases(mac):
        if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and lease.get("ipaddr"):
            return str(lease["ipaddr"])
    return None


def _address_from_arp(dom: Any, mac: str) -> str | None:
    try:
        return _first_ipv4(dom.interfaceAddresses(ARP, 0), mac)
    except libvirt.libvirtError:
        return None


class ProxyDomain(pulumi.dynamic.Resource):
    ip: pulumi.Output[str]
    mac: pulumi.Output[str]
    state: pulumi.Output[str]

    def __init__(
        self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None
    ) -> None:
        outputs: dict[str, Any] = {"ip": None, "mac": None, "state": None, "created": None}
        super().__init__(
            ProxyDomainProvider(),
            name,
            {**props, **outputs},
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
        )
