"""The project's ``<metadata>`` element: how a domain says "this proxy is ours".

Written inside the domain XML as::

    <metadata>
      <ep:proxy xmlns:ep="https://egress-proxies.dev/xmlns/proxy/1">
        <ep:managed>true</ep:managed>
        <ep:project>egress-proxies</ep:project>
        <ep:stack>dev</ep:stack>
        <ep:name>home-0</ep:name>
        <ep:created>2025-01-02T03:04:05Z</ep:created>
      </ep:proxy>
    </metadata>

Read back by namespace URI and local name, never by prefix: libvirt keeps the
prefix it was given last (``virDomainSetMetadata`` takes its own key), and
``virDomainGetMetadata`` returns the element with no namespace at all.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime

from providers.kvm.domainxml import _xml
from providers.kvm.domainxml._checks import check_text

NS_URI = "https://egress-proxies.dev/xmlns/proxy/1"
"""Namespace of the element; pass it as ``uri`` to ``dom.metadata``/``dom.setMetadata``."""

NS_PREFIX = "ep"
"""Prefix written by the builder; pass it as ``key`` to ``dom.setMetadata``."""

ROOT_TAG = "proxy"
"""Local name of the element inside ``<metadata>``."""

_FIELDS = ("managed", "project", "stack", "name", "created")


def format_rfc3339(moment: datetime) -> str:
    """UTC, whole seconds, ``Z`` suffix: ``2025-01-02T03:04:05Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ProxyMetadata:
    """Marks of ownership carried by every domain the project defines.

    ``created`` must be timezone-aware; it is stored in UTC with whole seconds,
    so a value survives the round trip through XML unchanged.
    """

    project: str
    stack: str
    name: str
    created: datetime
    managed: bool = True

    def __post_init__(self) -> None:
        check_text("ProxyMetadata.project", self.project)
        check_text("ProxyMetadata.stack", self.stack)
        check_text("ProxyMetadata.name", self.name)
        if not isinstance(self.managed, bool):
            raise ValueError(f"ProxyMetadata.managed: {self.managed!r} is not a bool")
        if not isinstance(self.created, datetime):
            raise ValueError(f"ProxyMetadata.created: {self.created!r} is not a datetime")
        if self.created.tzinfo is None or self.created.utcoffset() is None:
            raise ValueError(
                f"ProxyMetadata.created: {self.created.isoformat()!r} has no timezone; "
                "pass an aware datetime (e.g. datetime.now(UTC))"
            )
        normalized = self.created.astimezone(UTC).replace(microsecond=0)
        object.__setattr__(self, "created", normalized)

    def _values(self) -> dict[str, str]:
        return {
            "managed": "true" if self.managed else "false",
            "project": self.project,
            "stack": self.stack,
            "name": self.name,
            "created": format_rfc3339(self.created),
        }

    def to_element(self) -> ET.Element:
        """The prefixed element for the domain XML (literal ``ep:`` tags + xmlns)."""
        root = _xml.element(f"{NS_PREFIX}:{ROOT_TAG}", {f"xmlns:{NS_PREFIX}": NS_URI})
        for key, value in self._values().items():
            _xml.sub(root, f"{NS_PREFIX}:{key}", text=value)
        return root

    def to_set_metadata_xml(self) -> str:
        """The element as ``dom.setMetadata(VIR_DOMAIN_METADATA_ELEMENT, xml, NS_PREFIX, NS_URI)``
        wants it: unqualified, libvirt puts every node into the namespace itself."""
        root = _xml.element(ROOT_TAG)
        for key, value in self._values().items():
            _xml.sub(root, key, text=value)
        return _xml.to_pretty_string(root)


def _find_proxy_element(root: ET.Element) -> tuple[ET.Element, str] | None:
    """The proxy element and the namespace its children use ('' for none)."""
    if root.tag == f"{{{NS_URI}}}{ROOT_TAG}":
        return root, NS_URI
    if root.tag == ROOT_TAG:
        # What dom.metadata(VIR_DOMAIN_METADATA_ELEMENT, NS_URI) returns: libvirt
        # already selected by namespace and strips it from every node.
        return root, ""
    if root.tag == "domain":
        found = root.find(f"./metadata/{{{NS_URI}}}{ROOT_TAG}")
        if found is not None:
            return found, NS_URI
    return None


def _from_element(node: ET.Element, ns: str) -> ProxyMetadata:
    values: dict[str, str] = {}
    for key in _FIELDS:
        child = node.find(f"{{{ns}}}{key}" if ns else key)
        if child is None:
            raise ValueError(f"proxy metadata: element {key!r} is missing")
        values[key] = (child.text or "").strip()
    if values["managed"] not in ("true", "false"):
        raise ValueError(f"proxy metadata: managed {values['managed']!r} is not true or false")
    try:
        created = datetime.fromisoformat(values["created"])
    except ValueError as exc:
        raise ValueError(
            f"proxy metadata: created {values['created']!r} is not an RFC 3339 time"
        ) from exc
    if created.tzinfo is None:
        raise ValueError(f"proxy metadata: created {values['created']!r} has no timezone")
    try:
        return ProxyMetadata(
            project=values["project"],
            stack=values["stack"],
            name=values["name"],
            created=created,
            managed=values["managed"] == "true",
        )
    except ValueError as exc:
        raise ValueError(f"proxy metadata: {exc}") from exc


def parse_metadata(xml: str) -> ProxyMetadata | None:
    """Read the project's metadata back.

    Accepts either a full domain XML (``dom.XMLDesc()``, any prefix), the bare
    element as written (``<ep:proxy xmlns:ep=...>``), or what
    ``dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS_URI)`` returns (an
    unqualified ``<proxy>``: libvirt already selected it by namespace, so only
    pass that call's output here, not arbitrary XML).

    Returns None when the XML carries no element of this namespace (a domain
    that is not ours); raises ValueError when the XML is not well-formed or the
    element is there but incomplete or invalid.
    """
    return metadata_from_element(_xml.parse(xml, "proxy metadata"))


def metadata_from_element(root: ET.Element) -> ProxyMetadata | None:
    """:func:`parse_metadata` for an already parsed ``<domain>`` or proxy element."""
    found = _find_proxy_element(root)
    if found is None:
        return None
    node, ns = found
    return _from_element(node, ns)
