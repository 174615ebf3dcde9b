"""``egress-proxies:autopilot`` against the rest of the config (the policy's
own bounds are its model's, proxyinfra/autopilot/policy.py): the groups it
scales are provisioned ``proxies[]`` entries, bounds in order, egressPerPod
names kubernetes providers; an ``unhealthyFor`` shorter than a boot is a
warning (a replacement still booting would be replaced again), not an
error: a lab of fast guests may want it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from proxyinfra.autopilot.policy import AutopilotPolicy, format_duration
from proxyinfra.checks import Report
from proxyinfra.config import ProviderEntry, ProxyEntry
from proxyinfra.registry import backends

BOOT_ALLOWANCE = timedelta(minutes=5)


def check_autopilot(
    policy: AutopilotPolicy,
    listed_names: Sequence[str],
    proxies: list[tuple[int, ProxyEntry]],
    providers: dict[str, ProviderEntry],
    c: Report,
) -> None:
    """The policy against the rest: groups are provisioned proxies[] entries
    (their own errors listed already when they are broken), bounds in order,
    egressPerPod names kubernetes providers."""
    recycle, scale = policy.recycle, policy.scale
    if recycle is not None:
        if all(
            rule is None for rule in (recycle.banned_sites, recycle.max_age, recycle.unhealthy_for)
        ):
            c.add(
                "autopilot.recycle",
                "nothing to recycle by: set bannedSites, maxAge, unhealthyFor or several",
            )
        if recycle.unhealthy_for is not None and recycle.unhealthy_for < BOOT_ALLOWANCE:
            c.warnings.append(
                f"autopilot.recycle.unhealthyFor is {format_duration(recycle.unhealthy_for)}, "
                f"under {format_duration(BOOT_ALLOWANCE)}: a new proxy is unhealthy until it "
                "has booted and squid answers (minutes; more where the boot installs squid), "
                "so a replacement still booting would be replaced again"
            )
        for j, name in enumerate(recycle.egress_per_pod):
            kind = providers[name].type if name in providers else None
            if kind != "kubernetes":
                what = f"is a {kind} provider" if kind else "is no provider"
                c.add(
                    f"autopilot.recycle.egressPerPod[{j}]",
                    f"{name!r} {what}; only kubernetes providers are listed here",
                )
    if scale is None:
        return
    entries = {p.name: p for _, p in proxies}
    listed = set(listed_names)
    registered = backends()
    for name, bounds in scale.groups.items():
        path = f"autopilot.scale.groups.{name}"
        entry = entries.get(name)
        if entry is None:
            if name not in listed:
                known = ", ".join(entries) or "none defined"
                c.add(path, f"unknown proxies[] entry {name!r} (proxies: {known})")
        elif entry.provider in providers:
            provider = providers[entry.provider]
            if not registered[provider.type].provisions:
                c.add(
                    path,
                    f"{name!r} is on {provider.type} provider {provider.name!r}, whose proxies have no replicas to scale",
                )
        if bounds.min > bounds.max:
            c.add(f"{path}.min", f"greater than max ({bounds.max}) (got {bounds.min})")
