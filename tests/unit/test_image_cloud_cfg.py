"""The proxy image's own cloud-init settings (scripts/proxy-image-cloud.cfg,
the image's /etc/cloud/cloud.cfg.d/90_egress_proxy.cfg), judged by Debian's
cloud-init itself: over Debian's /etc/cloud/cloud.cfg and cloud-init's
built-in defaults, as a guest merges them at boot, they pass cloud-init's
schema (else every boot logs "Invalid cloud-config provided"), and its ssh
module generates no host key with them (the image has no sshd); its final
stage runs Debian's config and final modules, in Debian's order, less
grub-dpkg (the image masks cloud-config.service)."""

from __future__ import annotations

import json
import subprocess

from tests.support.cloudinit import DEBIAN_PYTHON
from tests.support.images import ROOT

CLOUD_CFG = ROOT / "scripts" / "proxy-image-cloud.cfg"

# Run by Debian's python3 (-I: not this checkout's modules). The ssh module
# runs with its commands and deletions recorded, never done: it would
# otherwise delete and make this machine's host keys.
JUDGE = """
import json, logging, sys
import yaml
from cloudinit import util
from cloudinit.config import cc_ssh
from cloudinit.config.schema import SchemaValidationError, get_schema, validate_cloudconfig_schema

image = yaml.safe_load(sys.stdin.read()) or {}
cfg = util.mergemanydict([image, util.read_conf("/etc/cloud/cloud.cfg"), util.get_builtin_cfg()])
try:
    validate_cloudconfig_schema(cfg, get_schema(), strict=True)
    problem = None
except SchemaValidationError as error:
    problem = str(error)
commands = []
cc_ssh.subp.subp = lambda cmd, *a, **k: commands.append(cmd) or ("", "")
cc_ssh.util.del_file = lambda path: None
cc_ssh.util.ensure_dir = lambda path, *a, **k: None
class Cloud:
    class datasource:
        publish_host_keys = staticmethod(lambda keys: None)
    distro = None
cc_ssh.handle("ssh", cfg, Cloud(), logging.getLogger("ssh"), [])
print(json.dumps({"problem": problem, "keygen": [c for c in commands if "ssh-keygen" in c]}))
"""

# Debian's stage lists beside the image's (the image's win, as at boot).
STAGES = """
import json, sys
import yaml
from cloudinit import util
image = yaml.safe_load(sys.stdin.read()) or {}
debian = util.read_conf("/etc/cloud/cloud.cfg")
merged = util.mergemanydict([image, debian])
print(json.dumps({
    "debian": debian["cloud_config_modules"] + debian["cloud_final_modules"],
    "config": merged["cloud_config_modules"],
    "final": merged["cloud_final_modules"],
}))
"""


def judged(settings: str, script: str = JUDGE) -> dict[str, object]:
    done = subprocess.run(
        [DEBIAN_PYTHON, "-I", "-c", script],
        input=settings,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_image_settings_pass_the_schema_and_make_no_host_key() -> None:
    assert judged(CLOUD_CFG.read_text()) == {"problem": None, "keygen": []}


def test_the_judge_sees_a_schema_error_and_a_host_key_made() -> None:
    """What the test above would catch: the empty key list the image once
    had, and cloud-init's default, which makes host keys."""
    empty = judged("ssh_genkeytypes: []\n")
    assert "ssh_genkeytypes: [] is too short" in str(empty["problem"])
    default = judged("datasource_list: [ NoCloud, None ]\n")
    assert default["problem"] is None and default["keygen"], default


def test_the_final_stage_runs_debians_config_and_final_modules_but_grub_dpkg() -> None:
    """With cloud-config.service masked, a module left out of the image's final
    list would never run (and a misspelt one is skipped with a warning)."""
    stages = judged(CLOUD_CFG.read_text(), STAGES)
    assert stages["config"] == []
    assert stages["final"] == [m for m in stages["debian"] if m != "grub-dpkg"]  # type: ignore[attr-defined]
