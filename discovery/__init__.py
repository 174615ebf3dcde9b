"""The discovery service: reads the stack's fleet manifest, health-probes every
proxy (health/) and hands proxies to crawlers as exclusive leases over HTTP.

Crawlers use the `egress-proxies-client` package (client/); operators run ``python -m discovery
serve`` (docs/discovery.md).
"""
