"""The discovery service: reads the stack's fleet manifest, health-probes every
proxy (health/) and hands proxies to crawlers as exclusive leases over HTTP.

Crawlers use :mod:`discovery.client`; operators run ``python -m discovery
serve`` (docs/discovery.md).
"""
