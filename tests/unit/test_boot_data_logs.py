"""Boot data never reaches a log, even at the most verbose level.

User-data carries the squid password hash and the operator's own additions,
vendor-data may carry secrets of its own: rendering them (kvm and gcp) and
putting them into a seed ISO must log none of it. Every record of every
logger is checked, whatever level would let it through
(tests/support/logcapture.py). Kubernetes renders its Secret inside the
program: tests/program/test_boot_data_logs.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import bcrypt
import pulumi
import pytest

from providers.gcp.bootstrap import render_metadata
from providers.gcp.config import GcpImage, image_bootstrap
from providers.gcp.squid_sync import CONF_KEY, PASSWORDS_KEY
from providers.kvm.seediso import SeedArgs, SeedIsoProvider
from proxyinfra import logs
from proxyinfra.backend import Credentials, ProxyRequest
from proxyinfra.cloudinit import default_vendor_data, render_meta_data, render_user_data
from proxyinfra.names import proxy_id
from proxyinfra.squid import SquidSettings, password_file_line, render_squid_conf
from proxyinfra.validation import validate
from tests.support.logcapture import every_record, leaks, telling_lines
from tests.support.mock_clouds import DEBIAN, UBUNTU
from tests.support.stack_config import placement, proxy, squid, stack_config
from tests.support.testdriver import TestHost

PROXY = "proxy-0123456789"
PASSWORD = "never-logged-password-5b2e"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
PASSWORDS = password_file_line("crawler", HASH)
AUTH_CONF = render_squid_conf(
    SquidSettings(allowed_clients=("10.0.0.0/8",), auth_username="crawler")
)
USER_TOKEN = "crawler-api-token-7d1e0c"
OWN_USER_DATA = f"""\
#cloud-config
write_files:
  - path: /etc/crawler/token
    content: {USER_TOKEN}
"""
VENDOR_TOKEN = "registry-token-93ab51"
OWN_VENDOR_DATA = f"""\
#!/bin/sh
echo 'registry-login: {VENDOR_TOKEN}' > /etc/registry-login
"""
SECRETS = [PASSWORD, HASH, PASSWORDS.strip(), USER_TOKEN, VENDOR_TOKEN]


@pytest.fixture(autouse=True)
def most_verbose(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # As a provider process started with EGRESS_PROXIES_LOG=2: the kvm
    # provider's first call configures logging from it (undone afterwards).
    monkeypatch.setenv(logs.ENV_LEVEL, "2")
    monkeypatch.setattr(logs, "_configured", False)
    yield


def user_data() -> str:
    return render_user_data(AUTH_CONF, PASSWORDS, OWN_USER_DATA, hostname=PROXY)


def test_rendering_user_vendor_and_meta_data_logs_none_of_it() -> None:
    with every_record() as texts:
        user = user_data()
        vendor = default_vendor_data()
        render_meta_data(f"{PROXY}-00000000", PROXY)
    assert HASH in user and USER_TOKEN in user  # the secrets are in there
    assert leaks(texts, [*SECRETS, *telling_lines(user), *telling_lines(vendor)]) == []


def test_a_seed_made_read_and_deleted_logs_none_of_its_documents(test_host: TestHost) -> None:
    user = user_data()
    args: SeedArgs[str] = SeedArgs(
        host=test_host.access(),
        name=f"{PROXY}-seed.iso",
        user_data=user,
        meta_data=render_meta_data(f"{PROXY}-00000000", PROXY),
        vendor_data=OWN_VENDOR_DATA,
    )
    props = args.to_props()
    provider = SeedIsoProvider()
    with every_record() as texts:
        assert provider.check({}, props).failures == []
        outs = dict(provider.create(props).outs or {})
        provider.read(outs["name"], outs)
        provider.delete(outs["name"], outs)
    # The capture saw the provider's own lines...
    assert any("seed uploaded" in text for text in texts)
    # ...and none of the documents.
    documents = [*telling_lines(user), *telling_lines(OWN_VENDOR_DATA)]
    assert leaks(texts, [*SECRETS, *documents]) == []


def gcp_request(tmp_path: Path, image: str) -> ProxyRequest:
    """A request for a proxy booting `image` (with the operator's userData
    where the image has cloud-init to read it)."""
    eu = proxy(
        "eu",
        "gcp-eu",
        where=placement("e2-small", "i", zone="europe-west1-b"),
        user_data=OWN_USER_DATA if image_bootstrap(image) == "cloud-init" else None,
    )
    gcp = {"project": "crawl-proj-1", "region": "europe-west1", "images": {"i": image}}
    provider = {"name": "gcp-eu", "type": "gcp", "gcp": gcp}
    raw = stack_config([provider], [eu], squid(username="crawler"))
    config = validate(raw, tmp_path)
    [replica] = config.replicas()
    # render_metadata takes the hash as text; the Outputs are the program's business.
    unused = cast(pulumi.Output[str], None)
    return ProxyRequest(
        project="egress-proxies",
        stack="dev",
        id=proxy_id("egress-proxies", "dev", replica.name),
        replica=replica,
        squid=config.squid,
        credentials=Credentials("crawler", password=unused, password_hash=unused),
    )


@pytest.mark.parametrize(
    ("image", "key"),
    [(UBUNTU, "user-data"), (DEBIAN, "startup-script")],
    ids=["cloud-init", "script"],
)
def test_gcp_boot_metadata_logs_none_of_it(tmp_path: Path, image: str, key: str) -> None:
    request = gcp_request(tmp_path, image)
    with every_record() as texts:
        metadata = render_metadata(request, GcpImage(image=image), HASH)
    assert HASH in metadata[PASSWORDS_KEY]
    documents = [metadata[key], metadata[CONF_KEY], metadata[PASSWORDS_KEY]]
    assert leaks(texts, [*SECRETS, *(line for d in documents for line in telling_lines(d))]) == []
