"""The gateway: one proxy URL for every client (docs/gateway.md).

`python -m discovery serve --gateway HOST:PORT` opens an HTTP/1.1 forward
proxy in the service's process that takes leases from the lease book
in-process and sends each request and tunnel through a leased squid.
"""

from discovery.gateway.listener import Gateway

__all__ = ["Gateway"]
