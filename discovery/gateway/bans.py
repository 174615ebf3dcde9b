"""What counts as a ban: the crawler client's policy, the one the Scrapy
middleware and the httpx transports apply (egress_proxies_client.BanPolicy),
imported rather than restated so that the gateway and the client never
disagree. This module is the service's only import of the client package
(the import contract in pyproject.toml allows exactly this one).
"""

from __future__ import annotations

from egress_proxies_client import BanPolicy

__all__ = ["BanPolicy"]
