"""The kubernetes backend's access check: which kubeconfig and context a
provider entry uses, and whether that context's API server answers a TCP
connect (a real socket on loopback), each failure in words that name the
file, context or address."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from providers.kubernetes.access import AccessError, ApiServer, api_server, check_reachable
from providers.kubernetes.config import KubernetesProvider


def kubeconfig(
    path: Path, server: str, contexts: tuple[str, ...] = ("a",), current: str = "a"
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "contexts": [
                    {"name": n, "context": {"cluster": "c", "user": "u"}} for n in contexts
                ],
                "current-context": current,
                "users": [{"name": "u", "user": {}}],
            }
        )
    )
    return path


def provider(**keys: str) -> KubernetesProvider:
    return KubernetesProvider.model_validate(keys)


def test_the_entry_s_kubeconfig_and_context_name_the_server(tmp_path: Path) -> None:
    kubeconfig(tmp_path / "kc", "https://10.0.0.1:6443", contexts=("a", "b"))
    server = api_server(provider(kubeconfig="kc", context="b"), tmp_path, env={})
    assert server == ApiServer("https://10.0.0.1:6443", "b", str(tmp_path / "kc"))
    assert server.address == ("10.0.0.1", 6443)
    # Without a context: the file's current one; without a port: https's.
    kubeconfig(tmp_path / "kc", "https://api.example")
    assert api_server(provider(kubeconfig="kc"), tmp_path, env={}).address == ("api.example", 443)


def test_without_kubeconfig_the_ambient_one_is_used(tmp_path: Path) -> None:
    first = kubeconfig(tmp_path / "one", "https://10.0.0.1:1", contexts=("a",), current="")
    second = kubeconfig(tmp_path / "two", "https://10.0.0.2:2", contexts=("a", "b"), current="b")
    env = {"KUBECONFIG": f"{first}:{second}", "HOME": str(tmp_path)}
    server = api_server(provider(), tmp_path, env=env)
    # The first file that names an entry wins (kubectl's merge).
    assert (server.context, server.url) == ("b", "https://10.0.0.1:1")
    (tmp_path / ".kube").mkdir()
    kubeconfig(tmp_path / ".kube" / "config", "https://10.0.0.3:3")
    assert api_server(provider(), tmp_path, env={"HOME": str(tmp_path)}).url == "https://10.0.0.3:3"


def test_a_missing_file_or_context_is_named(tmp_path: Path) -> None:
    with pytest.raises(AccessError, match=f"kubeconfig {tmp_path}/nope does not exist"):
        api_server(provider(kubeconfig="nope"), tmp_path, env={})
    kubeconfig(tmp_path / "kc", "https://10.0.0.1:6443", contexts=("a", "b"))
    with pytest.raises(AccessError) as caught:
        api_server(provider(kubeconfig="kc", context="prod"), tmp_path, env={})
    assert (
        str(caught.value) == f"context 'prod' is not in kubeconfig {tmp_path}/kc (contexts: a, b)"
    )
    kubeconfig(tmp_path / "kc", "https://10.0.0.1:6443", current="")
    with pytest.raises(AccessError, match=r"selects no context; set kubernetes\.context"):
        api_server(provider(kubeconfig="kc"), tmp_path, env={})
    (tmp_path / "kc").write_text("- just a list\n")
    with pytest.raises(AccessError, match="is not a kubeconfig"):
        api_server(provider(kubeconfig="kc"), tmp_path, env={})


def test_an_api_server_that_answers_passes_and_a_closed_port_is_named() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        check_reachable(ApiServer(f"https://127.0.0.1:{port}", "a", "kc"))
    # The port is closed now: connection refused.
    with pytest.raises(AccessError) as caught:
        check_reachable(ApiServer(f"https://127.0.0.1:{port}", "a", "kc"))
    assert str(caught.value) == (
        f"cannot reach the Kubernetes API server https://127.0.0.1:{port} "
        "(context 'a' of kubeconfig kc): Connection refused"
    )


def test_an_address_that_drops_packets_fails_after_the_timeout() -> None:
    asked: list[tuple[tuple[str, int], float]] = []

    def silent(address: tuple[str, int], timeout: float) -> socket.socket:
        asked.append((address, timeout))
        raise TimeoutError("timed out")

    with pytest.raises(AccessError, match=r"https://192.0.2.1:6443 .*: timed out"):
        check_reachable(ApiServer("https://192.0.2.1:6443", "a", "kc"), connect=silent, timeout=2)
    assert asked == [(("192.0.2.1", 6443), 2)]


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://api.example", ("api.example", 80)),
        ("http://api.example/", ("api.example", 80)),
        ("https://api.example", ("api.example", 443)),
        ("http://api.example:8080", ("api.example", 8080)),
        ("http://[fd00::1]", ("fd00::1", 80)),
    ],
)
def test_a_server_without_a_port_is_checked_on_its_scheme_s_port(
    tmp_path: Path, url: str, address: tuple[str, int]
) -> None:
    kubeconfig(tmp_path / "kc", url)
    dialled: list[tuple[str, int]] = []

    def connect(to: tuple[str, int], timeout: float) -> socket.socket:
        dialled.append(to)
        return socket.socket()

    check_reachable(api_server(provider(kubeconfig="kc"), tmp_path, env={}), connect=connect)
    assert dialled == [address]
