"""The background builds' progress in the suite's output
(tests/support/build_progress.py): each new step of a log once, nothing in
the first minute, nothing for a log that does not move."""

from __future__ import annotations

from pathlib import Path

from tests.support.build_progress import BuildProgress, last_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def append(log: Path, line: str) -> None:
    with log.open("a") as f:
        f.write(line + "\n")


def test_each_new_step_is_written_once_after_the_quiet_minute(tmp_path: Path) -> None:
    cli, kube, missing = tmp_path / "cli.log", tmp_path / "kube.log", tmp_path / "none.log"
    clock, written = Clock(), list[str]()
    progress = BuildProgress([cli, kube, missing], written.append, clock, quiet=60.0)
    append(cli, "build-pulumi: cached: /cache/pulumi")  # a warm build, done at once
    append(kube, "build-kube: [1/3] resolving")
    progress.poll()
    clock.now += 59.0
    append(kube, "build-kube: [2/3] building kubelet")
    progress.poll()
    assert written == []  # the first minute: what a cached build says is no news

    clock.now += 1.0
    progress.poll()  # the baseline, still nothing
    append(kube, "build-kube: [3/3] building images")
    progress.poll()
    progress.poll()
    append(cli, "")  # an empty line is no step
    progress.poll()
    append(kube, "build-kubernetes-plugin: [3/4] building (cold: about 15 minutes)")
    progress.poll()
    assert written == [
        "background build: build-kube: [3/3] building images",
        "background build: build-kubernetes-plugin: [3/4] building (cold: about 15 minutes)",
    ]


def test_last_line_reads_the_end_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)) + "\n\n")
    assert last_line(log) == "line 9999"
    assert last_line(tmp_path / "absent.log") is None
    (tmp_path / "empty.log").write_text("")
    assert last_line(tmp_path / "empty.log") is None
