"""Validate a whole stack config and report every error at once.

Each error carries its config path and the offending value, e.g.
``proxies[2].placement.zone: unknown host 'nas9' (hosts: nas1, nas2)``. Parsing
is per entry so one broken provider does not hide the errors of the others.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from proxyinfra.autopilot.policy import AutopilotPolicy
from proxyinfra.autopilot_checks import check_autopilot
from proxyinfra.backend import Backend
from proxyinfra.clients import client_ranges
from proxyinfra.config import (
    NAME_PATTERN,
    Generations,
    ProviderEntry,
    ProxyEntry,
    Replica,
    Squid,
    StackConfig,
    replica_names,
    resolve_path,
)
from proxyinfra.config_issues import ConfigError, ConfigIssue, pydantic_issues, show
from proxyinfra.discovery_checks import check_discovery
from proxyinfra.discovery_config import PATTERN_WORDS as DISCOVERY_PATTERN_WORDS
from proxyinfra.discovery_config import DiscoveryConfig
from proxyinfra.generation_checks import check_generations
from proxyinfra.registry import backends

__all__ = ["ConfigError", "ConfigIssue", "Replica", "StackConfig", "resolve_path", "validate"]

TOP_LEVEL_KEYS = ("providers", "proxies", "squid", "autopilot", "generations", "discovery")
_OWN_PATTERN_WORDS = {
    NAME_PATTERN: "must be 1-40 lowercase letters, digits or '-', starting with a letter",
}


def _issues(error: ValidationError, prefix: str, model: type[BaseModel]) -> list[ConfigIssue]:
    return pydantic_issues(error, prefix, model, _pattern_words())


def _pattern_words() -> dict[str, str]:
    words = {**_OWN_PATTERN_WORDS, **DISCOVERY_PATTERN_WORDS}
    for backend in backends().values():
        words.update(backend.pattern_words)
    return words


class _Collector:
    """The Report every check writes into (proxyinfra.checks.Report)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.issues: list[ConfigIssue] = []
        self.warnings: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(path, message))


def validate(raw: Mapping[str, Any], base_dir: Path) -> StackConfig:
    """Parse and check the config (keys without the namespace). Raises
    ConfigError listing every problem; returns the typed config otherwise."""
    c = _Collector(base_dir)
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            c.add(f"egress-proxies:{key}", f"unknown key (allowed: {', '.join(TOP_LEVEL_KEYS)})")

    providers, broken = _parse_providers(raw.get("providers"), c)
    proxies = _parse_proxies(raw.get("proxies"), c)
    squid = _parse_squid(raw.get("squid"), c)
    autopilot = _parse_autopilot(raw.get("autopilot"), c)
    generations = _parse_generations(raw.get("generations"), c)
    discovery = _parse_discovery(raw.get("discovery"), c)

    for name, provider in providers.items():
        backends()[provider.type].check_provider(provider, _provider_path(raw, name), c)
    replicas = _check_proxies(proxies, providers, broken, c)
    if squid is not None:
        _check_squid(squid, proxies, providers, c)
    listed = _raw_names(raw.get("proxies"))  # broken entries' names too
    if autopilot is not None:
        check_autopilot(autopilot, listed, proxies, providers, c)
    per_pod = (
        None if raw.get("autopilot") is not None and autopilot is None else _per_pod(autopilot)
    )
    generations = check_generations(generations, proxies, listed, providers, replicas, per_pod, c)

    if discovery is not None:
        check_discovery(discovery, providers, set(broken), squid, c)

    if c.issues:
        raise ConfigError(c.issues)
    assert squid is not None
    return StackConfig(
        providers=providers,
        proxies=[p for _, p in proxies],
        squid=squid,
        base_dir=base_dir,
        warnings=c.warnings,
        replica_lists=replicas,
        autopilot=autopilot,
        generations=generations,
        discovery=discovery,
    )


def _provider_path(raw: Mapping[str, Any], name: str) -> str:
    for i, entry in enumerate(raw.get("providers") or []):
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return f"providers[{i}]"
    return "providers[?]"


def _parse_providers(
    value: Any, c: _Collector
) -> tuple[dict[str, ProviderEntry], dict[str, Mapping[str, Any]]]:
    """Parsed providers by name, and the raw entries of those that have errors."""
    providers: dict[str, ProviderEntry] = {}
    broken: dict[str, Mapping[str, Any]] = {}
    if value is None:
        return providers, broken
    if not isinstance(value, list):
        c.add("providers", f"must be a list of providers (got {show(value)})")
        return providers, broken
    registered = backends()
    types_list = ", ".join(sorted(registered))
    for i, entry in enumerate(value):
        path = f"providers[{i}]"
        if not isinstance(entry, Mapping):
            c.add(path, f"must be a mapping (got {show(entry)})")
            continue
        kind = entry.get("type")
        backend = registered.get(kind) if isinstance(kind, str) else None
        if backend is None:
            what = "required" if kind is None else f"unknown provider type {show(kind)}"
            c.add(f"{path}.type", f"{what} (types: {types_list})")
            continue
        try:
            parsed = backend.entry_model.model_validate(entry)
        except ValidationError as error:
            c.issues.extend(_issues(error, path, backend.entry_model))
            if isinstance(entry.get("name"), str):
                broken[entry["name"]] = entry
            continue
        if parsed.name in providers:
            c.add(f"{path}.name", f"duplicate provider name {parsed.name!r}")
            continue
        providers[parsed.name] = parsed
    return providers, broken


def _parse_proxies(value: Any, c: _Collector) -> list[tuple[int, ProxyEntry]]:
    proxies: list[tuple[int, ProxyEntry]] = []
    if value is None:
        return proxies
    if not isinstance(value, list):
        c.add("proxies", f"must be a list of proxies (got {show(value)})")
        return proxies
    for i, entry in enumerate(value):
        try:
            proxies.append((i, ProxyEntry.model_validate(entry)))
        except ValidationError as error:
            c.issues.extend(_issues(error, f"proxies[{i}]", ProxyEntry))
    return proxies


def _parse_squid(value: Any, c: _Collector) -> Squid | None:
    try:
        return Squid.model_validate(value if value is not None else {})
    except ValidationError as error:
        c.issues.extend(_issues(error, "squid", Squid))
        return None


def _parse_autopilot(value: Any, c: _Collector) -> AutopilotPolicy | None:
    if value is None:
        return None
    try:
        return AutopilotPolicy.model_validate(value)
    except ValidationError as error:
        c.issues.extend(_issues(error, "autopilot", AutopilotPolicy))
        return None


def _parse_generations(value: Any, c: _Collector) -> dict[str, int]:
    if value is None:
        return {}
    if isinstance(value, Mapping):  # YAML may key by a number: named here, not as `[key]`
        for key in [k for k in value if not isinstance(k, str)]:
            c.add(f"generations.{key}", f"not a replica slot such as home-0 (got {show(key)})")
        value = {k: v for k, v in value.items() if isinstance(k, str)}
    try:
        return dict(Generations.model_validate(value).root)
    except ValidationError as error:
        c.issues.extend(_issues(error, "generations", Generations))
        # The keys whose values are good are still checked against the rest.
        bad = {e["loc"][0] for e in error.errors() if e["loc"]}
        good = value.items() if isinstance(value, Mapping) else []
        return {k: v for k, v in good if k not in bad}


def _parse_discovery(value: Any, c: _Collector) -> DiscoveryConfig | None:
    if value is None:
        return None
    try:
        return DiscoveryConfig.model_validate(value)
    except ValidationError as error:
        c.issues.extend(_issues(error, "discovery", DiscoveryConfig))
        return None


def _per_pod(policy: AutopilotPolicy | None) -> list[str]:
    recycle = policy.recycle if policy is not None else None
    return list(recycle.egress_per_pod) if recycle is not None else []


def _raw_names(raw_proxies: Any) -> list[str]:
    """The names of proxies[] entries read leniently (broken ones included)."""
    if not isinstance(raw_proxies, list):
        return []
    return [
        e["name"] for e in raw_proxies if isinstance(e, Mapping) and isinstance(e.get("name"), str)
    ]


def _check_proxies(
    proxies: list[tuple[int, ProxyEntry]],
    providers: dict[str, ProviderEntry],
    broken: dict[str, Mapping[str, Any]],
    c: _Collector,
) -> dict[str, list[str]]:
    """Every proxy's own checks and its backend's; the replica names of each entry."""
    registered = backends()
    replica_lists: dict[str, list[str]] = {}
    made_by: dict[str, str] = {}
    for i, proxy in proxies:
        path = f"proxies[{i}]"
        provider = providers.get(proxy.provider)
        if provider is None and proxy.provider in broken:
            # Its own errors are listed already; still check what can be checked.
            raw = broken[proxy.provider]
            backend = registered.get(str(raw.get("type")))
            if backend is not None:
                backend.check_proxy(proxy, None, raw, path, c)
            continue
        if provider is None:
            known = ", ".join(providers) or "none defined"
            c.add(f"{path}.provider", f"unknown provider {proxy.provider!r} (providers: {known})")
            continue
        backend = registered[provider.type]
        if backend.provisions:
            _check_provisioned(proxy, provider, backend, path, c)
        if proxy.max_unavailable is not None and not backend.rolls:
            c.add(
                f"{path}.maxUnavailable",
                f"not used by {provider.type} proxies: only a backend whose replacements "
                "delete first (kvm, gcp) replaces a group's proxies in turn",
            )
        backend.check_proxy(proxy, provider, {}, path, c)
        names = replica_names(proxy, backend.provisions)
        replica_lists[proxy.name] = names
        for name in names:
            if name in made_by:
                c.add(f"{path}.name", f"proxy name {name!r} also made by {made_by[name]}")
            else:
                made_by[name] = path
    return replica_lists


def _check_provisioned(
    proxy: ProxyEntry, provider: ProviderEntry, backend: Backend, path: str, c: _Collector
) -> None:
    if proxy.url is not None:
        c.add(f"{path}.url", f"only for external providers ({provider.name!r} is {provider.type})")
    if proxy.user_data is None:
        return
    if not backend.takes_user_data:
        c.add(f"{path}.userData", f"not used by {provider.type} proxies")
        return
    _check_user_data(proxy, path, c)


def _check_user_data(proxy: ProxyEntry, path: str, c: _Collector) -> None:
    text = proxy.user_data or ""
    if not text.startswith("#cloud-config"):
        c.add(f"{path}.userData", "must be a cloud-config document starting with '#cloud-config'")
        return
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        c.add(f"{path}.userData", f"not valid YAML{where}")
        return
    if doc is not None and not isinstance(doc, dict):
        c.add(f"{path}.userData", f"must be a YAML mapping (got {type(doc).__name__})")


def _check_squid(
    squid: Squid,
    proxies: list[tuple[int, ProxyEntry]],
    providers: dict[str, ProviderEntry],
    c: _Collector,
) -> None:
    registered = backends()
    provisioned = any(
        p.provider in providers and registered[providers[p.provider].type].provisions
        for _, p in proxies
    )
    if provisioned and not squid.allowed_clients:
        c.add(
            "squid.allowedClients", "required: the CIDRs of the crawlers that may use the proxies"
        )
    if squid.allow_open_proxy_to_the_internet:
        everyone = client_ranges(squid.allowed_clients).everyone
        if everyone and provisioned:
            c.warnings.append(
                "squid.allowOpenProxyToTheInternet is true: squid, the GCP firewall rules and "
                f"the Kubernetes NetworkPolicies admit every {' and '.join(everyone)} address "
                "on the proxy port; anyone who finds a proxy can use it"
                + ("" if squid.auth else ", and without squid.auth nothing stops them")
            )
        return
    # The same list opens squid, the GCP firewall and the Kubernetes
    # NetworkPolicy / load balancer, so one flag governs all three.
    hint = "set squid.allowOpenProxyToTheInternet: true if that is really meant"
    whole = False
    for j, cidr in enumerate(squid.allowed_clients):
        if ipaddress.ip_network(cidr).prefixlen == 0:
            whole = True
            c.add(
                f"squid.allowedClients[{j}]",
                f"{cidr!r} opens the proxies to the whole internet; {hint}",
            )
    everyone = client_ranges(squid.allowed_clients).everyone
    if everyone and not whole:
        c.add(
            "squid.allowedClients",
            f"together these admit every {' and '.join(everyone)} address, which opens the "
            f"proxies to the whole internet; {hint}",
        )
