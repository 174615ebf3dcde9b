"""Debian's cloud-init, run on a NoCloud seed in a scratch directory: what a
VM's cloud-init makes of user-data and vendor-data together.

Run by Debian's /usr/bin/python3 (whose site-packages hold the `cloudinit`
package of the project's Debian list), never imported by the tests: it reads
{"user-data": ..., "meta-data": ..., "vendor-data": ...} as JSON on stdin,
runs cloud-init's own init stage on them (datasource discovery, instance
set-up, the part handlers for user-data and then vendor-data) with every path
under a temporary directory, and prints as JSON the configuration the modules
would run with (cloud-init's merge of user and vendor cloud-config), the
vendor scripts it wrote for its scripts_vendor module, and what its apt
module would write for that configuration on a Debian bookworm guest
(sources.list and the apt proxy file, recorded instead of written). Nothing
is applied to this machine.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile

from cloudinit import helpers, sources, stages, util
from cloudinit.config import cc_apt_configure
from cloudinit.settings import PER_ALWAYS

SYSTEM_CONFIG = "/etc/cloud/cloud.cfg"
RELEASE = "bookworm"  # the guest's codename (lsb_release of the image)


def apt_files(merged: dict[str, object], cloud: object, root: str) -> dict[str, str]:
    """What cloud-init's apt module writes for this configuration: its own
    functions, with the one fixed path (/etc/apt/sources.list) recorded."""
    apt = cc_apt_configure.convert_to_v3_apt_format(copy.deepcopy(merged)).get("apt") or {}
    written: dict[str, str] = {}
    mirrors = cc_apt_configure.find_apt_mirror_info(apt, cloud, arch="amd64")
    if util.is_false(apt.get("preserve_sources_list", False)):
        real_write = util.write_file
        util.write_file = lambda path, content, *a, **k: written.__setitem__(path, content)
        try:
            cc_apt_configure.generate_sources_list(apt, RELEASE, mirrors, cloud)
        finally:
            util.write_file = real_write
    proxy_file, conf_file = f"{root}/apt-proxy", f"{root}/apt-conf"
    cc_apt_configure.apply_apt_config(apt, proxy_file, conf_file)
    if os.path.exists(proxy_file):
        with open(proxy_file, encoding="utf-8") as proxy:
            written["/etc/apt/apt.conf.d/90cloud-init-aptproxy"] = proxy.read()
    return written


def consume(documents: dict[str, str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="cloudinit-sandbox-") as root:
        return _consume(documents, root)


def _consume(documents: dict[str, str], root: str) -> dict[str, object]:
    seed = os.path.join(root, "seed")
    os.makedirs(seed)
    for name, text in documents.items():
        with open(os.path.join(seed, name), "w", encoding="utf-8") as out:
            out.write(text)
    # Over the system configuration a Debian guest has (the cloud-init
    # package's /etc/cloud/cloud.cfg, the same file on this machine) and
    # cloud-init's built-in defaults beneath it.
    config = util.mergemanydict(
        [
            {
                "datasource_list": ["NoCloud"],
                "datasource": {"NoCloud": {"seedfrom": f"file://{seed}/"}},
                "system_info": {
                    "distro": "debian",
                    "paths": {"cloud_dir": f"{root}/cloud", "run_dir": f"{root}/run"},
                },
            },
            util.read_conf(SYSTEM_CONFIG),
            util.get_builtin_cfg(),
        ]
    )

    class Sandbox(stages.Init):
        """Reads this configuration instead of /etc/cloud."""

        def _read_cfg(self, extra_fns: object) -> dict[str, object]:
            return copy.deepcopy(config)

        def _initialize_filesystem(self) -> None:
            util.ensure_dirs(self._initial_subdirs())  # no log file to chown

    init = Sandbox(ds_deps=[sources.DEP_FILESYSTEM])
    init.initialize()
    init.fetch(existing="trust")
    init.instancify()
    init.update()
    init.consume_data(PER_ALWAYS)
    merged = helpers.ConfigMerger(
        paths=init.paths, datasource=init.datasource, additional_fns=[], base_cfg=config
    ).cfg
    scripts_dir = init.paths.get_ipath_cur("vendor_scripts")
    scripts = {}
    if scripts_dir and os.path.isdir(scripts_dir):
        for name in sorted(os.listdir(scripts_dir)):
            with open(os.path.join(scripts_dir, name), encoding="utf-8") as script:
                scripts[name] = script.read()
    return {
        "datasource": type(init.datasource).__name__,
        "packages": merged.get("packages") or [],
        "runcmd": merged.get("runcmd") or [],
        "write_files": merged.get("write_files") or [],
        "vendor_scripts": scripts,
        "apt_files": apt_files(merged, init.cloudify(), root),
    }


if __name__ == "__main__":
    print(json.dumps(consume(json.load(sys.stdin))))
