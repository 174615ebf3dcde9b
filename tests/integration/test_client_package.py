"""The crawler client as a distribution of its own (client/): what
scripts/build-client builds, and what `pip install egress-proxies-client`
(and `[scrapy]`) puts into an empty virtualenv: httpx's closure and the
package (and Scrapy's with the extra), wheels only, nothing of the
infrastructure. The crawls run from that environment are in
test_crawlers.py."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.client_venv import ClientVenv, make_venv
from tests.support.programs import ROOT

pytestmark = pytest.mark.integration

# The service's and the Pulumi program's dependencies: none may come along.
INFRASTRUCTURE = {
    "pulumi",
    "pulumi-gcp",
    "pulumi-kubernetes",
    "libvirt-python",
    "paramiko",
    "psycopg",
    "psycopg-pool",
    "uvicorn",
    "starlette",
    "prometheus-client",
    "pydantic",
}


def site_packages_size(venv: ClientVenv) -> tuple[int, int]:
    """(bytes under site-packages, distributions installed)."""
    [site] = (venv.root / "lib").glob("python3*/site-packages")
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    return size, len(list(site.glob("*.dist-info")))


def test_the_wheel_and_the_sdist_hold_the_package_and_no_pins(
    client_dist: tuple[Path, Path],
) -> None:
    wheel, sdist = client_dist
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = archive.read(metadata).decode()
    for module in ("__init__.py", "py.typed", "scrapy.py", "_pool.py", "_transport.py"):
        assert f"egress_proxies_client/{module}" in names
    assert not any(n.startswith(("discovery/", "tests/", "health/")) for n in names), names
    assert "Name: egress-proxies-client" in meta
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["Requires-Dist: httpx<1,>=0.27"]
    assert any(r.startswith("Requires-Dist: scrapy") and 'extra == "scrapy"' in r for r in requires)
    assert not any("==" in r.split(";")[0] for r in requires), requires  # ranges, not pins
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "src/egress_proxies_client/py.typed"} <= members
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size} bytes; sdist {sdist.stat().st_size}")


def test_alone_it_installs_httpx_and_nothing_of_the_infrastructure(
    tmp_path: Path, client_dist: tuple[Path, Path]
) -> None:
    venv = make_venv(tmp_path / "venv", *client_dist, ())
    installed, closure = venv.distributions()
    assert installed - venv.baseline == closure
    assert {"egress-proxies-client", "httpx"} <= closure and "scrapy" not in installed
    assert not installed & INFRASTRUCTURE
    surface = venv.run(
        "-c",
        "import egress_proxies_client as c; print(c.__version__, ' '.join(sorted(c.__all__)))",
    )
    assert surface.returncode == 0, surface.stderr
    version, names = surface.stdout.split(" ", 1)
    assert version == "0.1.0" and venv.wheel.name.startswith(f"egress_proxies_client-{version}-")
    for public in ("lease", "alease", "DiscoveryTransport", "AsyncDiscoveryTransport", "LeasePool"):
        assert public in names.split()
    # Nothing of the project on its path; the Scrapy middleware needs the extra.
    for module in ("discovery", "health", "proxyinfra", "egress_proxies_client.scrapy"):
        done = venv.run("-c", f"import {module}")
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, (module, done)
    size, count = site_packages_size(venv)
    print(
        f"\npip install egress-proxies-client: {venv.install_seconds:.1f} s, {count} dists, {size / 1e6:.1f} MB"
    )


def test_with_the_scrapy_extra_it_installs_scrapys_closure_too(client_venv: ClientVenv) -> None:
    installed, closure = client_venv.distributions()
    assert installed - client_venv.baseline == closure
    assert {"egress-proxies-client", "httpx", "scrapy", "twisted"} <= closure
    assert not installed & INFRASTRUCTURE
    done = client_venv.run(
        "-c", "from egress_proxies_client.scrapy import DiscoveryProxyMiddleware; print('ok')"
    )
    assert done.stdout.strip() == "ok", done.stderr
    size, count = site_packages_size(client_venv)
    print(
        f"\npip install egress-proxies-client[scrapy]: {client_venv.install_seconds:.1f} s, "
        f"{count} dists, {size / 1e6:.1f} MB"
    )


def test_scripts_build_client_leaves_no_build_output_in_the_source_tree(
    client_dist: tuple[Path, Path],
) -> None:
    client = ROOT / "client"
    assert not (client / "build").exists()
    assert not list(client.rglob("*.egg-info"))
