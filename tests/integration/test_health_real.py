"""The probe and the engine against a real squid and real local servers.

squid runs with the project's rendered squid.conf (tests/support/squid.py);
targets and misbehaving "proxies" are asyncio servers on 127.0.0.1
(tests/support/responders.py).  Nothing leaves the loopback interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from health.engine import HealthEngine
from health.model import Health, Outcome, ProxyEndpoint
from health.probe import ProbeResult, probe
from tests.support.responders import FakeProxy, Target
from tests.support.squid import RunningSquid, loopback_settings, start_squid

pytestmark = pytest.mark.integration

PASSWORD = "pa ss:wörd"  # a space, a colon and non-ASCII: Basic auth must carry them
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(30):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def auth_squid() -> Iterator[RunningSquid]:
    with start_squid(loopback_settings(auth_username="crawler"), PASSWORD) as squid:
        yield squid


def endpoint(squid: RunningSquid, password: str | None = PASSWORD) -> ProxyEndpoint:
    return ProxyEndpoint("sq", "127.0.0.1", squid.port, squid.username, password)


async def probe_target(proxy: ProxyEndpoint, **options: Any) -> ProbeResult:
    async with Target() as target:
        return await probe(proxy, f"127.0.0.1:{target.port}", **options)


# --- the probe and squid's answers -------------------------------------------------------


def test_squid_with_right_password_passes(auth_squid: RunningSquid) -> None:
    result = run(probe_target(endpoint(auth_squid)))
    assert result.outcome is Outcome.OK, result
    assert result.status == 200
    assert result.connect_ms is not None and 0 < result.connect_ms < 1000
    assert result.answer_ms is not None and 0 < result.answer_ms < 1000
    assert result.tls_ms is None and result.error is None


@pytest.mark.parametrize("credentials", [("crawler", "wrong"), ("intruder", PASSWORD), None])
def test_wrong_or_missing_password_is_auth_required(
    auth_squid: RunningSquid, credentials: tuple[str, str] | None
) -> None:
    user, password = credentials or (None, None)
    result = run(probe_target(ProxyEndpoint("sq", "127.0.0.1", auth_squid.port, user, password)))
    assert result.outcome is Outcome.AUTH_REQUIRED, result
    assert result.status == 407
    assert result.error is not None and "407 Proxy Authentication Required" in result.error


def test_client_outside_the_acl_is_denied() -> None:
    # 127.0.0.1 is not in 10.0.0.0/8: squid says 403 even to the right password.
    settings = loopback_settings(allowed_clients=("10.0.0.0/8",), auth_username="crawler")
    with start_squid(settings, PASSWORD) as squid:
        result = run(probe_target(endpoint(squid)))
    assert result.outcome is Outcome.DENIED, result
    assert result.status == 403
    assert result.error is not None and "ERR_ACCESS_DENIED" in result.error


def test_target_down_is_an_upstream_failure(auth_squid: RunningSquid, refused: str) -> None:
    result = run(probe(endpoint(auth_squid), refused))
    assert result.outcome is Outcome.UPSTREAM, result
    assert result.status == 503
    assert result.error is not None and "ERR_CONNECT_FAIL" in result.error


# --- TLS through the tunnel ----------------------------------------------------------------


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: Any, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    else:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem(path: Path, *items: Any) -> Path:
    data = b""
    for item in items:
        if isinstance(item, x509.Certificate):
            data += item.public_bytes(serialization.Encoding.PEM)
        else:
            data += item.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA, a server certificate it signed, and an unrelated CA."""
    folder = tmp_path_factory.mktemp("tls")
    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "health test CA")])
    ca = _certificate("health test CA", ca_key, ca_name, ca_key, ca=True)
    other_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "other CA")])
    other = _certificate("other CA", other_key, other_name, other_key, ca=True)
    server = _certificate("localhost", server_key, ca_name, ca_key, ca=False)
    return {
        "ca": _pem(folder / "ca.pem", ca),
        "other_ca": _pem(folder / "other.pem", other),
        "server": _pem(folder / "server.pem", server, server_key),
    }


def test_tls_handshake_through_the_tunnel(
    auth_squid: RunningSquid, tls_files: dict[str, Path]
) -> None:
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tls_files["server"])
    ca, other_ca = str(tls_files["ca"]), str(tls_files["other_ca"])

    async def body() -> dict[str, ProbeResult]:
        async with Target(server_context) as target:
            where = f"127.0.0.1:{target.port}"
            proxy = endpoint(auth_squid)
            return {
                "unverified": await probe(proxy, where, tls=True),
                "right CA": await probe(proxy, where, tls=True, ca_file=ca),
                "right CA, by name": await probe(
                    proxy, where, tls=True, ca_file=ca, server_hostname="localhost"
                ),
                "other CA": await probe(proxy, where, tls=True, ca_file=other_ca),
                "wrong name": await probe(
                    proxy, where, tls=True, ca_file=ca, server_hostname="example.com"
                ),
            }

    results = run(body())
    for name in ("unverified", "right CA", "right CA, by name"):
        assert results[name].outcome is Outcome.OK, (name, results[name])
        tls_ms = results[name].tls_ms
        assert tls_ms is not None and 0 < tls_ms < 1000
    for name in ("other CA", "wrong name"):
        result = results[name]
        assert result.outcome is Outcome.TLS, (name, result)
        assert result.status == 200 and result.tls_ms is None  # squid did its part
        assert result.error is not None and "CERTIFICATE_VERIFY_FAILED" in result.error


def test_tls_to_a_plain_target_fails_within_the_timeout(auth_squid: RunningSquid) -> None:
    started = time.monotonic()
    result = run(probe_target(endpoint(auth_squid), tls=True, timeout=0.5))
    assert result.outcome is Outcome.TIMEOUT, result
    assert result.error == "no TLS handshake through the tunnel in 0.5 s"
    assert time.monotonic() - started < 1.0


# --- misbehaving proxies -------------------------------------------------------------


def _local(port: int) -> ProxyEndpoint:
    return ProxyEndpoint("fake", "127.0.0.1", port)


def test_proxy_that_never_answers_times_out_within_the_bound() -> None:
    """The probe gives up at its timeout, once: it ends about when a plain
    sleep of the same length started beside it ends (a loaded machine delays
    both alike), not a third of a timeout or more later."""

    async def sleep_until_timeout(loop: asyncio.AbstractEventLoop) -> float:
        await asyncio.sleep(0.3)
        return loop.time()

    async def body() -> tuple[ProbeResult, float, float]:
        loop = asyncio.get_running_loop()
        async with FakeProxy("silent") as fake:
            started = loop.time()
            sleeper = asyncio.create_task(sleep_until_timeout(loop))
            result = await probe(_local(fake.port), "example.com:443", timeout=0.3)
            ended = loop.time()
            return result, ended - started, ended - await sleeper

    result, elapsed, after_sleep = run(body())
    assert result.outcome is Outcome.TIMEOUT, result
    assert result.connect_ms is not None and result.answer_ms is None
    assert result.error == "no answer to CONNECT in 0.3 s"
    assert elapsed >= 0.3
    assert after_sleep < 0.1, after_sleep


@pytest.mark.parametrize(
    ("answer", "then_close"),
    [
        (b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", False),  # a wrong service on the port
        (b"HTTP/1.1 OK\r\n\r\n", False),  # no status code
        (b"HTTP/1.1 200 " + b"x" * 20_000, False),  # a head without end
        (b"HTTP/1.1 200 Connection established\r\n", True),  # cut off
    ],
)
def test_garbage_answer_is_malformed_and_seen_at_once(answer: bytes, then_close: bool) -> None:
    async def body() -> tuple[ProbeResult, float]:
        async with FakeProxy(answer=answer, close_after_answer=then_close) as fake:
            started = time.monotonic()
            result = await probe(_local(fake.port), "example.com:443", timeout=5.0)
            return result, time.monotonic() - started

    result, elapsed = run(body())
    assert result.outcome is Outcome.MALFORMED, result
    assert elapsed < 1.0  # recognised from the bytes, not by waiting for the timeout


def test_answer_arriving_byte_by_byte() -> None:
    answer = b"HTTP/1.1 200 Connection established\r\nVia: 1.1 x\r\n\r\n"

    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for index in range(len(answer)):
            writer.write(answer[index : index + 1])
            await writer.drain()
            await asyncio.sleep(0.001)
        await reader.read()  # until the probe closes
        writer.close()

    async def body() -> ProbeResult:
        server = await asyncio.start_server(dribble, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            return await probe(_local(port), "example.com:443", timeout=5.0)

    result = run(body())
    assert result.outcome is Outcome.OK, result
    assert result.answer_ms is not None and result.answer_ms >= len(answer) * 0.5  # ~1 ms a byte


@pytest.mark.parametrize("behaviour", ["close", "reset"])
def test_proxy_dropping_the_connection_is_a_reset(behaviour: Any) -> None:
    async def body() -> ProbeResult:
        async with FakeProxy(behaviour) as fake:
            return await probe(_local(fake.port), "example.com:443", timeout=2.0)

    result = run(body())
    assert result.outcome is Outcome.RESET, result
    assert result.connect_ms is not None and result.answer_ms is None


def test_nothing_listening_is_refused(refused: str) -> None:
    result = run(probe(_local(int(refused.rsplit(":", 1)[1])), "example.com:443", timeout=2.0))
    assert result.outcome is Outcome.REFUSED, result
    assert result.connect_ms is None


@pytest.mark.parametrize(("listen", "host"), [("127.0.0.1", "localhost"), ("::1", "::1")])
def test_proxy_by_name_or_ipv6_address(listen: str, host: str) -> None:
    async def body() -> ProbeResult:
        async with FakeProxy(host=listen) as fake:
            return await probe(ProxyEndpoint("f", host, fake.port), "example.com:443")

    result = run(body())
    assert result.outcome is Outcome.OK, result


def test_credentials_are_sent_only_when_set() -> None:
    async def body() -> list[bytes]:
        async with FakeProxy(record=True) as fake:
            await probe(_local(fake.port), "example.com:443")
            await probe(ProxyEndpoint("f", "127.0.0.1", fake.port, "u", "p"), "example.com:443")
            return fake.requests

    plain, with_auth = run(body())
    assert b"Proxy-Authorization" not in plain
    assert b"\r\nProxy-Authorization: Basic dTpw\r\n" in with_auth


# --- the engine against a real squid ------------------------------------------------------


def test_engine_follows_squid_going_down_and_up() -> None:
    """The engine follows squid probe by probe: unhealthy at the second
    failure in a row (fail_threshold), healthy again at the first probe squid
    answers (ok_threshold). Read from the order of probe results and health
    changes, not from seconds, which a loaded machine stretches (seen: 1.007 s
    to come up, on a fresh machine building Go beside the suite); the
    deadlines only keep a broken engine from hanging the test."""
    events: list[bool | Health] = []  # a probe's result (ok or not), or a change

    async def recorded(endpoint: ProxyEndpoint, target: str, **options: Any) -> ProbeResult:
        result = await probe(endpoint, target, **options)
        events.append(result.ok)  # the engine records it next, with no await between
        return result

    class Changes:
        def on_health_change(self, name: str, health: Health) -> None:
            events.append(health)

    async def body() -> str | None:
        async with Target() as target:
            squid = await asyncio.to_thread(
                start_squid, loopback_settings(auth_username="crawler"), PASSWORD
            )
            try:
                eng = HealthEngine(
                    target=f"127.0.0.1:{target.port}",
                    interval=0.5,
                    timeout=1.0,
                    probe_fn=recorded,
                    listener=Changes(),
                )
                eng.set_fleet([endpoint(squid)])
                await eng.start()
                try:
                    await _until(eng, Health.HEALTHY, within=30.0)
                    healthy = eng.health("sq")
                    assert healthy is not None and healthy.latency_ms is not None
                    # squid takes ~2 s to exit after SIGINT; watch meanwhile.
                    stopped = asyncio.create_task(asyncio.to_thread(squid.stop))
                    await _until(eng, Health.UNHEALTHY, within=30.0)
                    await stopped
                    await asyncio.to_thread(squid.start)
                    await _until(eng, Health.HEALTHY, within=30.0)
                    state = eng.health("sq")
                    assert state is not None
                    return state.last_error
                finally:
                    await eng.stop()
            finally:
                await asyncio.to_thread(squid.close)

    last_error = run(body())
    assert last_error is not None and last_error.startswith("refused")
    changes = [i for i, event in enumerate(events) if isinstance(event, Health)]
    assert [events[i] for i in changes] == [Health.HEALTHY, Health.UNHEALTHY, Health.HEALTHY]
    first, down, up = changes
    assert events[:first] == [True], events  # healthy at its first answer
    while_healthy = [event for event in events[first + 1 : down] if isinstance(event, bool)]
    while_down = [event for event in events[down + 1 : up] if isinstance(event, bool)]
    # Down at the second failure in a row, up at the first answer after them.
    assert all(while_healthy[:-2]) and while_healthy[-2:] == [False, False], events
    assert not any(while_down[:-1]) and while_down[-1:] == [True], events


async def _until(eng: HealthEngine, health: Health, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (state := eng.health("sq")) is None or state.health is not health:
        assert loop.time() < deadline, f"not {health} within {within} s: {state}"
        await asyncio.sleep(0.01)


def test_engine_probes_a_proxy_added_to_the_fleet_at_once() -> None:
    """A proxy added is probed at once, not at the next round: the round is an
    hour away here, so only the path for new proxies can have probed it (read
    from what was probed, not from milliseconds a loaded machine stretches)."""

    async def body() -> None:
        async with _three_proxies(interval=3600.0) as (fake, eng, (p0, p1, p2)):
            await _probed(fake, {p0.port: 1, p1.port: 1})
            eng.set_fleet([p1, p2])
            await _probed(fake, {p2.port: 1})
            assert fake.per_port[p1.port] == 1  # no round came between
            assert eng.health("p0") is None
            assert [(p.name, p.health) for p in eng.all()] == [
                ("p1", Health.HEALTHY),
                ("p2", Health.HEALTHY),
            ]

    run(body())


def test_engine_stops_probing_a_proxy_removed_and_goes_on_with_the_rest() -> None:
    async def body() -> None:
        async with _three_proxies(interval=0.2) as (fake, eng, (p0, p1, p2)):
            await _probed(fake, {p0.port: 2, p1.port: 2})
            eng.set_fleet([p1, p2])
            await _probed(fake, {p2.port: 1})  # by then a probe of p0 in flight has ended
            removed, kept = fake.per_port[p0.port], fake.per_port[p1.port]
            await _probed(fake, {p1.port: kept + 3})  # three rounds more
            assert fake.per_port[p0.port] == removed
            assert eng.health("p0") is None

    run(body())


@contextlib.asynccontextmanager
async def _three_proxies(
    interval: float,
) -> AsyncIterator[tuple[FakeProxy, HealthEngine, tuple[ProxyEndpoint, ...]]]:
    """Three fake proxies p0, p1, p2; an engine probing p0 and p1, started."""
    async with FakeProxy(ports=3) as fake, Target() as target:
        eng = HealthEngine(target=f"127.0.0.1:{target.port}", interval=interval)
        proxies = tuple(
            ProxyEndpoint(f"p{i}", "127.0.0.1", port) for i, port in enumerate(fake.ports)
        )
        eng.set_fleet(proxies[:2])
        await eng.start()
        try:
            yield fake, eng, proxies
        finally:
            await eng.stop()


async def _probed(fake: FakeProxy, counts: dict[int, int], within: float = 30.0) -> None:
    """Until each port has had at least its count of probes (the deadline only
    keeps a broken engine from hanging the test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while any(fake.per_port[port] < count for port, count in counts.items()):
        assert loop.time() < deadline, f"probes {dict(fake.per_port)}, wanted {counts}"
        await asyncio.sleep(0.002)


def test_engine_through_real_squid_falls_back_and_tells_a_target_down_from_the_fleet(
    refused: str,
) -> None:
    """Eight proxies of the fleet (names) on one real squid. With a closed
    port first and a listening target second, every probe falls back and
    the fleet is healthy. Then the only target stops listening: squid answers
    503 for every proxy, the target is judged down, and no proxy is lost."""
    interval = 0.5
    names = [f"sq{i}" for i in range(8)]

    async def body(squid: RunningSquid) -> None:
        fleet = [ProxyEndpoint(n, "127.0.0.1", squid.port, "crawler", PASSWORD) for n in names]
        closed = refused
        async with Target() as target:
            listening = f"127.0.0.1:{target.port}"
            eng = HealthEngine(target=(closed, listening), interval=interval, timeout=1.0)
            eng.set_fleet(fleet)
            await eng.start()
            try:
                await asyncio.sleep(3 * interval)
                assert {p.health for p in eng.all()} == {Health.HEALTHY}
                assert _gauge(eng, closed) == 1.0 and _gauge(eng, listening) == 0.0
            finally:
                await eng.stop()
        async with Target() as target:
            only = f"127.0.0.1:{target.port}"
            eng = HealthEngine(target=only, interval=interval, timeout=1.0)
            eng.set_fleet(fleet)
            await eng.start()
            try:
                await asyncio.sleep(2 * interval)
                assert {p.health for p in eng.all()} == {Health.HEALTHY}
                await target.__aexit__()  # nothing listens there now: squid says 503
                await asyncio.sleep(5 * interval)
                assert _gauge(eng, only) == 1.0
                assert {p.health for p in eng.all()} == {Health.HEALTHY}
                down = eng.registry.get_sample_value("egress_health_probes_targets_down_total")
                assert down is not None and down >= len(names)
            finally:
                await eng.stop()

    with start_squid(loopback_settings(auth_username="crawler"), PASSWORD) as squid:
        run(body(squid))


def _gauge(eng: HealthEngine, target: str) -> float | None:
    return eng.registry.get_sample_value("egress_health_probe_target_down", {"target": target})
