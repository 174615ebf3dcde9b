"""What an answer says about the proxy it came through, and what counts as a
ban: the crawler client's rule (`egress_proxies_client.verdict`, with its
`BanPolicy`), the one the Scrapy middleware and the httpx transports apply,
imported rather than restated so that the gateway and the client never
disagree. This module is the service's only import of the client package
(the import contract in pyproject.toml allows exactly this one).
"""

from __future__ import annotations

from egress_proxies_client import BanPolicy, verdict

__all__ = ["BanPolicy", "verdict"]
