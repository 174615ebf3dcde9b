"""`python -m proxyinfra autopilot` run as an operator runs it, against a
stack of the real Pulumi CLI on simulated kvm hosts and the real discovery
service in a thread, for the engine tests of the autopilot
(tests/engine/test_cli_autopilot*.py): one World per module's stack.

The service reads the fleet from a file written from `pulumi stack output
--json --show-secrets` (the documented way to feed it a stack's manifest):
`publish` rewrites it after an update and waits until the service serves
that fleet, so what the next round's signals count is the stack's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from providers.kvm.simulated import SimulatedHost
from proxyinfra.autopilot.automation import AutomationStack
from proxyinfra.autopilot.changes import Scale
from proxyinfra.autopilot.seam import Updated
from proxyinfra.autopilot.targets import edit_for
from proxyinfra.names import proxy_id
from proxyinfra.validation import validate
from tests.support import ROOT
from tests.support.discovery import ServerThread, wait_for
from tests.support.pulumi_cli import PROJECT, CliStack


@dataclass
class World:
    stack: CliStack
    hosts: Path
    fleet: Path
    service: ServerThread
    state: Path  # the autopilot's round state file
    name: str  # the stack's name, as --stack takes it
    token: str  # the service's bearer token ($DISCOVERY_TOKEN)

    def autopilot(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def argv(self, *args: str) -> list[str]:
        command = autopilot_argv(self.stack.directory, *args, "--stack", self.name)
        if args[:1] not in (("pause",), ("resume",)):
            command += ["--discovery", self.service.url]
        return command

    def env(self) -> dict[str, str]:
        return self.stack.env() | {"DISCOVERY_TOKEN": self.token}

    def publish(self) -> dict[str, Any]:
        """The stack's output as the service reads it; waits until it serves it."""
        outputs = json.loads(self.stack.ok("stack", "output", "--json", "--show-secrets").stdout)
        tmp = self.fleet.with_suffix(".tmp")
        tmp.write_text(json.dumps(outputs))
        os.replace(tmp, self.fleet)
        names = {p["name"] for p in outputs["fleet"]["proxies"]}
        with self.http() as http:
            wait_for(
                lambda: set(served_names(http)) == names, what="the service to serve the fleet"
            )
        return outputs["fleet"]  # type: ignore[no-any-return]

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.service.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )

    def history(self) -> list[dict[str, Any]]:
        return json.loads(self.stack.ok("stack", "history", "--json").stdout)  # type: ignore[no-any-return]

    def config(self) -> dict[str, Any]:
        document = yaml.safe_load(self.stack.stack_file.read_text())
        return {k.split(":", 1)[1]: v for k, v in document["config"].items()}

    def replicas(self) -> dict[str, int]:
        """Each `proxies[]` entry's replicas, as the stack's config file holds them."""
        return {p["name"]: int(p.get("replicas", 1)) for p in self.config()["proxies"]}

    def vanish(self, name: str, host: str = "home--nas1") -> None:
        """Replica NAME's domain gone from its host, as a VM that died and was
        removed (a GCP Spot VM deleted when preempted is the like)."""
        host_ = SimulatedHost(self.hosts / host, pool="default", network="n")
        try:
            dom = host_.libvirt().lookupByName(proxy_id(PROJECT, self.stack.stack, name))
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        finally:
            host_.close()

    def mac(self, name: str, host: str = "home--nas1") -> str:
        host_ = SimulatedHost(self.hosts / host, pool="default", network="n")
        try:
            xml = host_.raw.lookupByName(proxy_id(PROJECT, self.stack.stack, name)).XMLDesc(0)
        finally:
            host_.close()
        mac: str = xml.split("<mac address='", 1)[1].split("'", 1)[0]
        return mac


def served_names(http: httpx.Client) -> list[str]:
    answer = http.get("/v1/proxies")
    answer.raise_for_status()
    return [p["name"] for p in answer.json()["proxies"]]


def autopilot_argv(project_dir: Path, *args: str) -> list[str]:
    """`python -m proxyinfra autopilot ARGS` on the project at PROJECT_DIR."""
    command = [sys.executable, "-m", "proxyinfra", "--project-dir", str(project_dir)]
    return [*command, "autopilot", *args]


def decisions(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The decision log's JSON lines a round printed on stdout."""
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def events(done: subprocess.CompletedProcess[str], event: str) -> Iterator[dict[str, Any]]:
    return (d for d in decisions(done) if d["event"] == event)


def scale_by_the_autopilot(
    stack: CliStack, group: str, before: int, after: int, monkeypatch: pytest.MonkeyPatch
) -> Updated:
    """GROUP scaled from BEFORE to AFTER as a round applies a change: the
    autopilot's own AutomationStack (in this process, with the stack's
    environment) writes the edit and runs the targeted update and partial
    run that `edit_for` computes. For stacks whose proxies the service
    cannot be fed signals for here (pods on the cluster)."""
    for key, value in stack.env().items():
        monkeypatch.setenv(key, value)
    automation = AutomationStack(stack.directory, stack.stack)
    deployed = automation.read()
    change = Scale(group, before, after, "demand", "a test's scale")
    config = validate(deployed.config, stack.directory)
    edit = edit_for(change, config, deployed, PROJECT, stack.stack)
    automation.set_config(edit.path, edit.after)
    return automation.update(change.message, edit.targets, edit.registers)
