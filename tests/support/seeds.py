"""A seed volume's inputs as the provider takes them, each document a key
(the program packs them into `documents`; providers.kvm.seeddocs)."""

from __future__ import annotations

from typing import Any

from providers.kvm.seediso import SeedArgs
from tests.support.testdriver import TestHost

SEED = "proxy-0123456789-seed.iso"


def seed_props(host: TestHost, user_data: str, **changes: Any) -> dict[str, Any]:
    args: SeedArgs[str] = SeedArgs(
        host=host.access(),
        name=SEED,
        user_data=user_data,
        meta_data="instance-id: proxy-0123456789-00000000\n",
        vendor_data="#!/bin/sh\ntrue\n",
    )
    return args.to_props() | changes
