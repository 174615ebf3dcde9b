"""A GCP proxy's squid changes in place: the startup script, the squid-sync
agent and a real squid in a guest of namespaces (tests/support/gce_guest.py),
against a metadata server on loopback (tests/support/gce_metadata.py).

The stack changes squid's metadata keys of an instance in place; these
tests show what the VM makes of it: the same squid process serving the new
config within seconds, a config squid refuses never applied, and what was
applied reported in the guest attributes.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace

import pytest

from providers.gcp.squid_sync import (
    AGENT_PATH,
    DIGEST_KEY,
    squid_digest,
    squid_metadata,
)
from providers.gcp.startup import render_startup_script
from proxyinfra.squid import SquidSettings, render_squid_conf
from tests.support.gce_guest import Guest
from tests.support.gce_metadata import MetadataServer
from tests.support.gce_proxy import (
    APPLIED_WITHIN_S,
    BOOT_CALLS,
    BOOT_FILES,
    file_modes,
    listed,
    passwords_of,
    settings,
    status,
    wait_for,
    wait_reported,
)
from tests.support.squid import EchoServer, free_port

pytestmark = pytest.mark.integration

BOOT = {
    "enable-oslogin": "TRUE",
    "enable-guest-attributes": "TRUE",
    "startup-script": render_startup_script(),
}


def metadata(squid: SquidSettings, passwords: str | None) -> dict[str, str]:
    return {**BOOT, **squid_metadata(render_squid_conf(squid), passwords)}


def test_a_squid_change_is_applied_in_place_by_the_agent(
    gce_server: MetadataServer, echo: EchoServer
) -> None:
    port = free_port()
    first = settings(port)
    gce_server.set(metadata(first, passwords_of("first-pass")))
    with closing(Guest(render_startup_script(), gce_server.host)) as guest:
        assert guest.boot_status() == 0, guest.log()
        # At boot: the agent wrote squid's files, squid restarted on them, the agent watches.
        assert guest.systemctl_calls() == BOOT_CALLS
        assert file_modes(guest, *BOOT_FILES) == BOOT_FILES
        # Nothing left beside them once the agent's first look (a no-op) is done.
        wait_for("no leftovers", lambda: listed(guest) == ["passwords", "squid.conf"], guest)
        wait_for("squid serving", lambda: status(port, echo, "first-pass") == 200, guest)
        pid = guest.squid_pid()
        assert pid is not None

        # What an apply that died leaves (the VM reset mid-apply): the next apply clears it.
        # Planted while the agent waits for a change, not during its first look: that
        # look clears leftovers before it starts, so one planted after would stay.
        wait_for("the agent waiting", lambda: gce_server.parked(DIGEST_KEY), guest)
        leftover = "/etc/squid/.sync.dEAd01"
        planted = guest.run(
            "sh", "-c", f"mkdir -m 0700 {leftover} && echo x > {leftover}/passwords"
        )
        assert planted.returncode == 0, planted.stderr
        # connectPorts narrowed: the same squid refuses the echo server's port.
        narrowed = replace(first, connect_ports=("443",))
        gce_server.set(metadata(narrowed, passwords_of("first-pass")))
        wait_for("ports narrowed", lambda: status(port, echo, "first-pass") == 403, guest)
        wait_for(
            "the leftover cleared", lambda: listed(guest) == ["passwords", "squid.conf"], guest
        )
        assert guest.read("/etc/squid/squid.conf") == render_squid_conf(narrowed)
        assert guest.squid_pid() == pid

        # A new password with the ports opened again: the old one is refused.
        new = passwords_of("second-pass")
        gce_server.set(metadata(first, new))
        wait_for("new password", lambda: status(port, echo, "second-pass") == 200, guest)
        assert status(port, echo, "first-pass") == 407
        assert guest.squid_pid() == pid
        wait_reported(gce_server, render_squid_conf(first), new, guest)
        assert gce_server.guest_attribute("egress-proxies/squid-error") == ""

        # Auth taken away: the password file goes with it.
        open_settings = replace(first, auth_username=None)
        gce_server.set(metadata(open_settings, None))
        wait_for("auth removed", lambda: status(port, echo, None) == 200, guest)
        assert guest.read("/etc/squid/passwords") is None
        assert guest.squid_pid() == pid


def test_a_config_squid_refuses_is_never_applied(
    gce_server: MetadataServer, echo: EchoServer
) -> None:
    port = free_port()
    good = settings(port, auth_username=None)
    gce_server.set(metadata(good, None))
    with closing(Guest(render_startup_script(), gce_server.host)) as guest:
        assert guest.boot_status() == 0, guest.log()
        wait_for("squid serving", lambda: status(port, echo, None) == 200, guest)
        conf = guest.read("/etc/squid/squid.conf")
        broken = render_squid_conf(good) + "bogus_directive on\n"
        gce_server.set(
            {
                **BOOT,
                "egress-proxies-squid-conf": broken,
                "egress-proxies-squid-sha256": squid_digest(broken, None),
            }
        )
        wait_for(
            "the refusal reported",
            lambda: (
                "bogus_directive"
                in (gce_server.guest_attribute("egress-proxies/squid-error") or "")
            ),
            guest,
        )
        assert "squid refused the new squid.conf" in guest.log("agent.log")
        assert guest.read("/etc/squid/squid.conf") == conf
        wait_for("no leftovers", lambda: listed(guest) == ["squid.conf"], guest)
        assert status(port, echo, None) == 200

        # Files that do not match their digest (read while the metadata moved) wait.
        narrowed = render_squid_conf(replace(good, connect_ports=("443",)))
        gce_server.set(
            {
                **BOOT,
                "egress-proxies-squid-conf": narrowed,
                "egress-proxies-squid-sha256": squid_digest(conf or "", None),
            }
        )
        wait_for("the mismatch seen", lambda: "do not match" in guest.log("agent.log"), guest)
        assert guest.read("/etc/squid/squid.conf") == conf
        # Then the digest that goes with them: applied.
        gce_server.set(metadata(replace(good, connect_ports=("443",)), None))
        wait_for("ports narrowed", lambda: status(port, echo, None) == 403, guest)


def test_applies_at_once_wait_for_each_other(gce_server: MetadataServer, echo: EchoServer) -> None:
    """The unit and a boot's `--once` can overlap (the unit is enabled, so it
    may start first at a reboot). Each apply first clears the work
    directories of applies that died, so it must never run beside another:
    the second waits for the lock while the first is held in its reads."""
    port = free_port()
    first = settings(port, auth_username=None)
    gce_server.set(metadata(first, None))
    with closing(Guest(render_startup_script(), gce_server.host)) as guest:
        assert guest.boot_status() == 0, guest.log()
        # The watching agent between applies (its long poll parked), so that
        # the two applies below are the only ones.
        wait_for("the agent waiting", lambda: gce_server.parked(DIGEST_KEY), guest)
        once = ("env", f"GCE_METADATA_HOST={gce_server.host}", AGENT_PATH, "--once")
        gce_server.hold(DIGEST_KEY)
        held = guest.popen(*once)
        try:
            assert gce_server.held(DIGEST_KEY, APPLIED_WITHIN_S)  # inside its apply
            waiting = guest.popen(*once)
            wait_for(
                "the second at the lock",
                lambda: guest.run("pgrep", "-x", "flock").returncode == 0,
                guest,
            )
        finally:
            gce_server.release(DIGEST_KEY)
        assert held.wait(timeout=APPLIED_WITHIN_S) == 0, held.stdout.read() if held.stdout else ""
        out = waiting.communicate(timeout=APPLIED_WITHIN_S)[0]
        assert waiting.returncode == 0, out
        wait_for("no leftovers", lambda: listed(guest) == ["squid.conf"], guest)
        assert status(port, echo, None) == 200


def test_a_change_undone_and_redone_while_the_agent_reads_is_applied(
    gce_server: MetadataServer, echo: EchoServer
) -> None:
    """The agent waits for the metadata to move on from the version it read,
    not from the one that woke it: woken by B, it reads A (B undone
    meanwhile), and B back before it waits again must still be taken."""
    port = free_port()
    first = settings(port, auth_username=None)
    narrowed = replace(first, connect_ports=("443",))
    reported = "egress-proxies/squid-sha256"
    gce_server.set(metadata(first, None))
    with closing(Guest(render_startup_script(), gce_server.host)) as guest:
        assert guest.boot_status() == 0, guest.log()
        wait_for("squid serving", lambda: status(port, echo, None) == 200, guest)
        applied = squid_digest(render_squid_conf(first), None)
        wait_for(
            "the watch under way", lambda: gce_server.guest_attribute(reported) == applied, guest
        )
        gce_server.hold(DIGEST_KEY)
        gce_server.set(metadata(narrowed, None))  # B wakes the agent...
        assert gce_server.held(DIGEST_KEY, APPLIED_WITHIN_S), guest.log("agent.log")
        gce_server.set(metadata(first, None))  # ...which reads A: B undone meanwhile
        gce_server.hold(reported)
        gce_server.release(DIGEST_KEY)
        # It found A in place and reports it; before it waits again, B is back.
        assert gce_server.held(reported, APPLIED_WITHIN_S), guest.log("agent.log")
        gce_server.set(metadata(narrowed, None))
        gce_server.release(reported)
        wait_for("B taken the second time", lambda: status(port, echo, None) == 403, guest)


def test_a_boot_on_a_config_squid_refuses_stops_before_squid(gce_server: MetadataServer) -> None:
    broken = "bogus_directive on\n"
    gce_server.set(
        {
            **BOOT,
            "egress-proxies-squid-conf": broken,
            "egress-proxies-squid-sha256": squid_digest(broken, None),
        }
    )
    with closing(Guest(render_startup_script(), gce_server.host)) as guest:
        assert guest.boot_status() != 0
        assert "bogus_directive" in guest.log()
        assert guest.systemctl_calls() == []  # squid keeps what it had
        assert guest.read("/etc/squid/squid.conf") is None
        reported = gce_server.guest_attribute("egress-proxies/squid-error") or ""
        assert "bogus_directive" in reported
