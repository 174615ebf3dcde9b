"""The README's commands: the main job reports a missing Pulumi CLI clearly."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_up_without_pulumi_cli_names_the_install_link(tmp_path: Path) -> None:
    # A PATH with bash and coreutils but no pulumi.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cat"):
        (bin_dir / tool).symlink_to(
            Path("/usr/bin", tool) if Path("/usr/bin", tool).exists() else Path("/bin", tool)
        )
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(bin_dir / "bash"), str(ROOT / "scripts" / "up")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 127
    assert "Pulumi CLI was not found" in done.stderr
    assert "https://www.pulumi.com/docs/install/" in done.stderr
