"""The spider the crawler tests run with `python -m scrapy runspider` (a
subprocess, as a crawler author runs one):

    python -m scrapy runspider tests/support/crawl_spider.py -a base=URL -a pages=40 \\
        -s DISCOVERY_URL=... -O items.jsonl

It asks for /page/0 ... /page/<pages-1> of `base` (or, with `-a urls=U1,U2`,
for those URLs) and yields one item per answer (page, status, the proxy's
name from the middleware). `fail_at=N`
makes the callback of page N raise (with CLOSESPIDER_ERRORCOUNT=1 the
spider then closes early, with requests in flight). `JsonStats` writes
Scrapy's stats to $CRAWL_STATS_FILE when the spider closes, after every
spider_closed handler (the middleware's releases included) has run.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.http import Response
from scrapy.statscollectors import MemoryStatsCollector, StatsT


class SiteSpider(scrapy.Spider):
    name = "site"
    custom_settings = {
        "DOWNLOADER_MIDDLEWARES": {"egress_proxies_client.scrapy.DiscoveryProxyMiddleware": 610},
        # The module as runspider loads it (by its file name, the project not on the path).
        "STATS_CLASS": "crawl_spider.JsonStats",
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "COOKIES_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "DOWNLOAD_DELAY": 0,
        "LOG_LEVEL": "INFO",
    }

    def __init__(
        self, base: str = "", pages: str = "10", fail_at: str = "", urls: str = "", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.base = base
        self.pages = int(pages)
        self.fail_at = int(fail_at) if fail_at else None
        self.urls = [u for u in urls.split(",") if u]

    async def start(self) -> AsyncIterator[Any]:
        for url in self.urls or [f"{self.base}/page/{page}" for page in range(self.pages)]:
            yield scrapy.Request(url, callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[dict[str, Any]]:
        page = int(response.url.rsplit("/", 1)[1])
        if page == self.fail_at:
            raise RuntimeError(f"the callback of page {page} fails on purpose")
        yield {
            "page": page,
            "status": response.status,
            "proxy": response.meta.get("discovery_proxy"),
            "text": response.text,
        }


class JsonStats(MemoryStatsCollector):
    def _persist_stats(self, stats: StatsT) -> None:
        super()._persist_stats(stats)
        path = os.environ.get("CRAWL_STATS_FILE")
        if path:
            with open(path, "w") as out:
                json.dump(stats, out, default=str)
