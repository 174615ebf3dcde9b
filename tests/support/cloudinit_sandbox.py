"""Debian's cloud-init, run on a NoCloud seed in a scratch directory: what a
VM's cloud-init makes of user-data and vendor-data together.

Run by Debian's /usr/bin/python3 (whose site-packages hold the `cloudinit`
package of the project's Debian list), never imported by the tests: it reads
{"user-data": ..., "meta-data": ..., "vendor-data": ...} as JSON on stdin,
runs cloud-init's own init stage on them (datasource discovery, instance
set-up, the part handlers for user-data and then vendor-data) with every path
under a temporary directory, and prints as JSON the configuration the modules
would run with (cloud-init's merge of user and vendor cloud-config) and the
vendor scripts it wrote for its scripts_vendor module. Nothing is applied.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile

from cloudinit import helpers, sources, stages, util
from cloudinit.settings import PER_ALWAYS


def consume(documents: dict[str, str]) -> dict[str, object]:
    root = tempfile.mkdtemp(prefix="cloudinit-sandbox-")
    seed = os.path.join(root, "seed")
    os.makedirs(seed)
    for name, text in documents.items():
        with open(os.path.join(seed, name), "w", encoding="utf-8") as out:
            out.write(text)
    # Over cloud-init's built-in defaults (which enable vendor-data), as when
    # /etc/cloud/cloud.cfg says nothing of these keys.
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
        "vendor_scripts": scripts,
    }


if __name__ == "__main__":
    print(json.dumps(consume(json.load(sys.stdin))))
