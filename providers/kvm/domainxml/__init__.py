"""Domain XML for the ProxyDomain resource, in the manner of virt-manager's virtinst:
declarative builder classes, one device per module, golden-file tests.

Entry points: :class:`DomainSpec` -> :func:`build_domain_xml`; reading back with
:func:`parse_domain` and :func:`parse_metadata`.
"""

from __future__ import annotations

from providers.kvm.domainxml.domain import build_domain_xml
from providers.kvm.domainxml.metadata import (
    NS_PREFIX,
    NS_URI,
    ROOT_TAG,
    ProxyMetadata,
    format_rfc3339,
    parse_metadata,
)
from providers.kvm.domainxml.parse import DiskInfo, DomainInfo, InterfaceInfo, parse_domain
from providers.kvm.domainxml.spec import DomainSpec
from providers.kvm.rules import CPU_MODES, MIN_MEMORY_MIB, DomainType, Firmware

__all__ = [
    "CPU_MODES",
    "MIN_MEMORY_MIB",
    "NS_PREFIX",
    "NS_URI",
    "ROOT_TAG",
    "DiskInfo",
    "DomainInfo",
    "DomainSpec",
    "DomainType",
    "Firmware",
    "InterfaceInfo",
    "ProxyMetadata",
    "build_domain_xml",
    "format_rfc3339",
    "parse_domain",
    "parse_metadata",
]
