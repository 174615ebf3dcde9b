"""What Debian's cloud-init makes of a seed: tests/support/cloudinit_sandbox.py
run by Debian's own interpreter (whose site-packages hold cloud-init)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from proxyinfra.cloudinit import render_meta_data

SANDBOX = Path(__file__).resolve().parent / "cloudinit_sandbox.py"
DEBIAN_PYTHON = "/usr/bin/python3"  # the interpreter of Debian's cloud-init package


def consumed(user_data: str, vendor_data: str) -> dict[str, Any]:
    """The sandbox's answer for a proxy's seed (see its docstring)."""
    documents = {
        "user-data": user_data,
        "meta-data": render_meta_data("proxy-0123456789", "p0"),
        "vendor-data": vendor_data,
    }
    done = subprocess.run(
        [DEBIAN_PYTHON, "-I", str(SANDBOX)],  # -I: not this checkout's modules
        input=json.dumps(documents),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["datasource"] == "DataSourceNoCloud"
    return result
