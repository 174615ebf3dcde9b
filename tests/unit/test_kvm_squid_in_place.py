"""New squid settings on a running kvm proxy: the domain's diff (an update
when only squid's files changed, a replacement for anything else, and for a
domain made before the two were told apart), the guest agent's part
(providers/kvm/squidpush.py) against a recording stand-in for the agent,
and the restart when no agent answers, against libvirt's test driver.
The agent of a real guest: tests/integration/test_end_to_end.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import libvirt
import pulumi
import pytest
import yaml

from providers.kvm import squidpush
from providers.kvm.domain import ProxyDomainProvider
from providers.kvm.errors import KvmError
from providers.kvm.squidfiles import SQUID_FILES, seed_parts, split_parts, squid_files
from proxyinfra.cloudinit import render_user_data
from tests.support.domain_props import NAME, domain_inputs
from tests.support.testdriver import TestHost

CONF = (
    "http_port 3128\nauth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/passwords\n"
)
PASSWORDS = "crawler:$2b$05$hash\n"


def user_data(conf: str = CONF, own: str | None = None) -> str:
    return render_user_data(conf, PASSWORDS, own, hostname=NAME)


def parts(text: str, vendor: str | None = "vendor") -> tuple[str, str]:
    return split_parts(seed_parts(text, [vendor, None]))


def test_the_digests_tell_squid_s_files_from_the_rest() -> None:
    squid, boot = parts(user_data())
    other_conf = parts(user_data(CONF + "connect_timeout 5 seconds\n"))
    assert other_conf[0] != squid and other_conf[1] == boot
    own = parts(user_data(own="#cloud-config\npackages: [htop]\n"))
    assert own[0] == squid and own[1] != boot
    vendor = parts(user_data(), "other vendor")
    assert vendor[0] == squid and vendor[1] != boot
    files = squid_files(user_data())
    assert [f["path"] for f in files] == sorted(SQUID_FILES)
    assert {f["path"]: f["content"] for f in files}[SQUID_FILES[0]] == CONF


def inputs(host: TestHost, **changes: Any) -> dict[str, Any]:
    return domain_inputs(host, seed_parts(user_data(), [None, None]), **changes)


def test_new_squid_settings_are_an_update_anything_else_a_replacement(
    test_host: TestHost,
) -> None:
    provider = ProxyDomainProvider()
    outs = dict(provider.create(inputs(test_host)).outs or {})
    squid, boot = split_parts(outs["seedParts"])
    new_squid = inputs(test_host, seedParts=f"{'1' * 16}:{boot}", seedSha256="cd" * 32)
    update = provider.diff(NAME, outs, new_squid)
    assert (update.changes, update.replaces) == (True, [])
    new_boot = inputs(test_host, seedParts=f"{squid}:{'2' * 16}", seedSha256="cd" * 32)
    assert provider.diff(NAME, outs, new_boot).replaces == ["seedParts"]
    # A preview of the seed's update: its outputs are not known yet.
    preview = inputs(test_host, seedPath=unknown(), seedSha256=unknown())
    assert provider.diff(NAME, outs, preview).replaces == []


def unknown() -> Any:
    """A value not known yet, as the engine hands a preview's diff."""
    return pulumi.output.Unknown()  # type: ignore[no-untyped-call]


def test_a_domain_made_before_the_digests_is_replaced_by_a_new_seed_as_then(
    test_host: TestHost,
) -> None:
    provider = ProxyDomainProvider()
    outs = dict(provider.create(inputs(test_host)).outs or {})
    # Outputs with the parts keep no seed digest (one secret less a proxy).
    assert "seedSha256" not in outs
    assert provider.diff(NAME, outs, inputs(test_host, seedSha256="cd" * 32)).changes is False
    # As an earlier release kept them: the seed's digest, no parts.
    earlier = {k: v for k, v in outs.items() if k != "seedParts"}
    earlier["seedSha256"] = inputs(test_host)["seedSha256"]
    assert provider.diff(NAME, earlier, inputs(test_host)).changes is False
    new_seed = provider.diff(NAME, earlier, inputs(test_host, seedSha256="cd" * 32))
    assert new_seed.replaces == ["seedSha256"]


def test_without_an_agent_the_update_restarts_the_domain(
    test_host: TestHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libvirt's test driver runs no guest agent: the domain is shut down and
    started again (its next boot applies the new seed); defined all along."""
    monkeypatch.setattr(squidpush, "seed_files", lambda _conn, _path: squid_files(user_data()))
    provider = ProxyDomainProvider()
    outs = dict(provider.create(inputs(test_host)).outs or {})
    dom = test_host.raw.lookupByName(NAME)
    first_id = dom.ID()
    boot = split_parts(outs["seedParts"])[1]
    news = inputs(test_host, seedParts=f"{'1' * 16}:{boot}", seedSha256="cd" * 32)
    updated = dict(provider.update(NAME, outs, news).outs or {})
    dom = test_host.raw.lookupByName(NAME)
    assert dom.isActive() and dom.ID() != first_id
    assert updated["state"] == "running" and updated["seedParts"] == news["seedParts"]


class Agent:
    """A guest agent that records what it is asked and keeps written files."""

    def __init__(self, exitcode: int = 0, err: str = "") -> None:
        self.files: dict[str, bytes] = {}
        self.commands: list[str] = []
        self.exitcode, self.err = exitcode, err
        self._open: dict[int, str] = {}

    def qemuAgentCommand(self, payload: str, _timeout: int, _flags: int) -> str:
        request = json.loads(payload)
        args = request.get("arguments", {})
        self.commands.append(request["execute"])
        answer: Any
        match request["execute"]:
            case "guest-file-open":
                handle = len(self._open) + 1
                self._open[handle] = args["path"]
                self.files[args["path"]] = b""
                answer = handle
            case "guest-file-write":
                self.files[self._open[args["handle"]]] += base64.b64decode(args["buf-b64"])
                answer = {"count": 1}
            case "guest-file-close":
                answer = {}
            case "guest-exec":
                self.script = args["arg"][1]
                answer = {"pid": 7}
            case "guest-exec-status":
                answer = {
                    "exited": True,
                    "exitcode": self.exitcode,
                    "err-data": base64.b64encode(self.err.encode()).decode(),
                }
        return json.dumps({"return": answer})


def test_the_push_writes_beside_checks_moves_in_and_reloads() -> None:
    agent = Agent()
    squidpush.push(agent, squid_files(user_data()), sleep=lambda _s: None)
    assert agent.files == {
        "/etc/squid/squid.conf.egress-new": CONF.encode(),
        "/etc/squid/passwords.egress-new": PASSWORDS.encode(),
    }
    steps = agent.script.split(" && ")
    check = steps.index("squid -k parse -f /etc/squid/squid.conf.egress-new")
    moves = [i for i, step in enumerate(steps) if step.startswith("mv -f ")]
    assert moves and min(moves) > check  # nothing moved in before squid's check
    assert "chown root:proxy /etc/squid/passwords.egress-new" in steps
    assert "chmod 0640 /etc/squid/passwords.egress-new" in steps
    assert steps[-3:-1] == ["systemctl reload-or-restart squid", "sleep 1"]
    assert steps[-1].startswith("python3 -c ") and "3128" in steps[-1]  # its port again


def test_a_refused_check_names_squid_s_words_and_never_the_file() -> None:
    agent = Agent(exitcode=1, err="FATAL: Bungled /etc/squid/squid.conf.egress-new line 2: x\n")
    with pytest.raises(KvmError) as info:
        squidpush.push(agent, squid_files(user_data()), sleep=lambda _s: None)
    message = str(info.value)
    assert "Bungled" in message and "the old ones stay in place" in message
    assert PASSWORDS.strip() not in message and "http_port" not in message


def test_an_agent_that_does_not_answer_is_no_agent() -> None:
    class Silent:
        def qemuAgentCommand(self, *_args: Any) -> str:
            raise libvirt.libvirtError("Guest agent is not responding")

    with pytest.raises(squidpush.NoAgent, match="guest-file-open"):
        squidpush.push(Silent(), squid_files(user_data()))


def test_squid_files_are_the_write_files_entries_of_the_user_data() -> None:
    document = yaml.safe_load(user_data())
    paths = [f["path"] for f in document["write_files"]]
    assert sorted(p for p in paths if p in SQUID_FILES) == [
        f["path"] for f in squid_files(user_data())
    ]
