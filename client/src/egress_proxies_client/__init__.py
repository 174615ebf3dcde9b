"""Proxies from an egress-proxies discovery service, for crawlers.

Three ways in (README.md): `lease()` / `alease()` for one proxy over a
block of code; `DiscoveryTransport` / `AsyncDiscoveryTransport` for httpx
clients that rotate per site on bans; and the Scrapy middleware
`egress_proxies_client.scrapy.DiscoveryProxyMiddleware` (the `[scrapy]`
extra). `LeasePool` is what the last two share; `verdict()` is what all of
them (and the service's gateway) make of an answer through a proxy, and
`proxy_failed()` what the adapters make of an error.
"""

from egress_proxies_client._bans import BanDetector, BanPolicy, proxy_failed, site_of, verdict
from egress_proxies_client._errors import DiscoveryError, NoProxyAvailable, PoolClosed
from egress_proxies_client._lease import AsyncLease, Lease, LeaseOptions, alease, lease
from egress_proxies_client._pool import Held, LeasePool
from egress_proxies_client._protocol import Outcome
from egress_proxies_client._transport import (
    AsyncDiscoveryTransport,
    DiscoveryTransport,
    RotationOptions,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncDiscoveryTransport",
    "AsyncLease",
    "BanDetector",
    "BanPolicy",
    "DiscoveryError",
    "DiscoveryTransport",
    "Held",
    "Lease",
    "LeaseOptions",
    "LeasePool",
    "NoProxyAvailable",
    "Outcome",
    "PoolClosed",
    "RotationOptions",
    "__version__",
    "alease",
    "lease",
    "proxy_failed",
    "site_of",
    "verdict",
]
