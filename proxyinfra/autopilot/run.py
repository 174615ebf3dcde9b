"""One round of the autopilot, and the loop of rounds.

A round: the pause file (paused: say so, change nothing); the stack's config
(validated: a bad policy is refused by path before any update) and state;
the service's signals over the policy's window; the plan; then each change
as one Pulumi update, one at a time, each with its one-line message and
targeted at what it changes (targets.py). The planner's state and the failed
updates are kept in the state file (memory.py) by a round that acted.

Safety, each rule once, here:

- **One operation at a time.** A change waits while another operation holds
  the stack's lock (polling with a doubling delay, logged with the holder
  when the backend names it) and never cancels it; after ``lock_timeout`` it
  gives up for this round, leaving the config as it found it.
- **A config edit lives only with its update.** It is written when the lock
  is free, right before the update, and undone when the update fails or the
  lock was taken in between: the config file never claims a change the
  stack did not get.
- **Failures back off and never loop.** A change whose update failed is not
  tried again before ``backoff`` (doubled per failure within the hour), and
  after ``retry_cap`` failures within an hour it is held (``capped``) and
  shown in the status and metrics until the hour has passed.
- **Dry run and pause change nothing**: no config write, no update, no
  state file write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from proxyinfra.autopilot.changes import Change, Recycle, after
from proxyinfra.autopilot.feed import SignalsSource, signals_from_answer
from proxyinfra.autopilot.fleet import FleetGroup, Room
from proxyinfra.autopilot.locks import StaleHolder
from proxyinfra.autopilot.log import DecisionLog
from proxyinfra.autopilot.memory import Memory, MemoryFiles
from proxyinfra.autopilot.plan import plan
from proxyinfra.autopilot.room import RoomRead, RoomSource
from proxyinfra.autopilot.seam import Clock, Deployed, StackBusy, UpdateFailed
from proxyinfra.autopilot.seam import Stack as StackSeam
from proxyinfra.autopilot.signals import Signals, evidence
from proxyinfra.autopilot.status import Status
from proxyinfra.autopilot.targets import Edit, edit_for, fleet_groups
from proxyinfra.config import StackConfig
from proxyinfra.validation import validate

DEFAULT_WINDOW = timedelta(minutes=10)  # the policy's, when it has no recycle block
HOUR = timedelta(hours=1)
# A change's results that fail `--once` (exit 1).
FAILED = frozenset({"failed", "lock-timeout", "stale-lock"})


@dataclass(frozen=True)
class Options:
    project: str  # Pulumi.yaml's name: URNs are made of it
    project_dir: Path
    dry_run: bool = False
    retry_cap: int = 3  # failed updates of one change within an hour, then held
    backoff: timedelta = timedelta(minutes=1)  # after a failure, doubled per failure
    lock_poll: float = 2.0  # first wait for another's lock, doubled up to lock_poll_max
    lock_poll_max: float = 30.0
    lock_timeout: float = 3600.0  # then this round gives up on its changes


def change_key(change: Change) -> str:
    """What the retry cap counts failures of: the proxy a recycle replaces,
    the group a scale changes."""
    if isinstance(change, Recycle):
        return f"recycle {change.proxy}"
    return f"scale {change.group}"


def kind_of(change: Change) -> str:
    return "recycle" if isinstance(change, Recycle) else "scale"


@dataclass
class _Outcome:
    result: str  # applied, failed, lock-timeout
    update: int | None = None
    error: str | None = None
    changed: Mapping[str, int] | None = None
    started: str | None = None


class Autopilot:
    def __init__(
        self,
        stack: StackSeam,
        signals: SignalsSource,
        clock: Clock,
        log: DecisionLog,
        files: MemoryFiles,
        status: Status,
        options: Options,
        room: RoomSource | None = None,  # None: no place has a known room (no limit but max)
    ) -> None:
        self.stack = stack
        self.signals = signals
        self.clock = clock
        self.log = log
        self.files = files
        self.status = status
        self.options = options
        self.room = room
        self.results: list[str] = []  # each change's result in the last round
        # The last round's changes that failed, one line each, for the operator's
        # terminal (the decision log may go to a file).
        self.failed: list[str] = []
        self._current: tuple[Deployed, StackConfig] | None = None
        self.stopping = False

    def stop(self) -> None:
        """Ends the loop after the change under way (SIGTERM): an update is
        never interrupted half way by the autopilot itself."""
        self.stopping = True

    # -- the round ---------------------------------------------------------------------

    def round(self) -> str:
        """One round; returns how it ended (planned, paused, dry-run). A bad
        config raises ConfigError before anything changes."""
        self.results, self.failed = [], []
        paused = self.files.paused()
        self.status.paused.set(1 if paused else 0)
        self.status.set(paused=paused)
        if paused is not None:
            self.log.write("round", result="paused", paused=paused)
            return self._ended("paused")
        deployed = self.stack.read()
        config = validate(deployed.config, self.options.project_dir)
        # Each change is made on the stack as it is then: the round's read for
        # the first, a new one after a change went through.
        self._current = (deployed, config)
        policy = config.autopilot
        if policy is None:
            self.log.write("round", result="no-policy", reason="no egress-proxies:autopilot block")
            return self._ended("no-policy")
        window = policy.recycle.window if policy.recycle is not None else DEFAULT_WINDOW
        answer = self.signals.fetch(int(window.total_seconds()))
        signals = signals_from_answer(answer, self.stack.name)
        groups = fleet_groups(config, deployed)
        memory = self.files.load()
        now = self.clock.now()
        read = RoomRead(tuple(groups), Room(), ())
        if self.room is not None and policy.scale is not None:
            read = self.room.read(config, groups, set(policy.scale.groups))
        the_plan = plan(policy, read.groups, signals, read.room, memory.planner, now)
        spells = the_plan.observed.unhealthy_since
        self.status.unhealthy.set(len(spells))
        self.status.set(unhealthySince={n: t.isoformat() for n, t in sorted(spells.items())})
        for held in (*read.held, *the_plan.held):
            self.log.write(
                "held", subject=held.subject, rule=held.rule, message=held.message, result="held"
            )
        failures = _recent(memory.failures, now)
        applied: list[Change] = []
        for change in the_plan.changes:
            outcome = self._change(change, signals, groups, failures, now)
            self.results.append(outcome)
            if outcome == "applied":
                applied.append(change)
            if outcome == "paused" or self.stopping:
                break
        capped = sorted(k for k, times in failures.items() if len(times) >= self.options.retry_cap)
        self.status.capped.set(len(capped))
        self.status.set(capped=capped)
        result = "dry-run" if self.options.dry_run else "planned"
        if not self.options.dry_run:
            state = after(the_plan.observed, applied, now)
            self.files.save(Memory(state, failures))
        self.log.write(
            "round",
            result=result,
            changes=len(the_plan.changes),
            applied=len(applied),
            held=len(read.held) + len(the_plan.held),
        )
        return self._ended(result)

    def _ended(self, result: str) -> str:
        self.status.rounds.labels(result).inc()
        self.status.set(lastRound={"at": self.clock.now().isoformat(), "result": result})
        return result

    # -- one change ----------------------------------------------------------------------

    def _change(
        self,
        change: Change,
        signals: Signals,
        groups: Sequence[FleetGroup],
        failures: dict[str, list[datetime]],
        now: datetime,
    ) -> str:
        kind, key = kind_of(change), change_key(change)
        fields: dict[str, Any] = {
            "kind": kind,
            "rule": change.rule,
            "group": change.group,
            "signal": evidence(change, signals, groups),
            "message": change.message,
        }
        failed = failures.get(key, [])
        if len(failed) >= self.options.retry_cap:
            until = failed[-self.options.retry_cap] + HOUR
            return self._logged(
                fields,
                "capped",
                reason=f"{len(failed)} failed updates within 1h (cap {self.options.retry_cap}): "
                f"held until {until.isoformat()}",
            )
        if failed:
            retry_at = failed[-1] + self.options.backoff * (2 ** (len(failed) - 1))
            if now < retry_at:
                return self._logged(
                    fields,
                    "backoff",
                    reason=f"its update failed; next try after {retry_at.isoformat()}",
                )
        if self._current is None:
            deployed = self.stack.read()
            self._current = (deployed, validate(deployed.config, self.options.project_dir))
        deployed, config = self._current
        edit = edit_for(change, config, deployed, self.options.project, self.stack.name)
        fields["proxies"] = list(edit.proxies)
        if self.options.dry_run:
            return self._logged(fields, "dry-run", path=edit.path, value=edit.after)
        if self.files.paused() is not None:
            return self._logged(fields, "paused", reason="paused during the round")
        # Said before it runs: an update takes minutes on real hosts, and
        # until it ends the change's own line is not written.
        self.log.write("applying", **{k: fields[k] for k in _APPLYING})
        self.status.set(applying={"message": change.message, "since": now.isoformat()})
        started = self.clock.monotonic()
        self._current = None
        try:
            outcome = self._apply(change, edit)
        finally:
            self.status.set(applying=None)
        duration = round(self.clock.monotonic() - started, 3)
        if outcome.result == "failed":
            self.status.failures.inc()
            failures.setdefault(key, []).append(self.clock.now())
        if outcome.result in FAILED:
            self.failed.append(f"{change.message}: {outcome.result}: {outcome.error}")
        return self._logged(
            fields,
            outcome.result,
            update=outcome.update,
            updateStart=outcome.started,
            duration=duration,
            error=outcome.error,
            resources=dict(outcome.changed) if outcome.changed else None,
        )

    def _logged(self, fields: dict[str, Any], result: str, **more: Any) -> str:
        self.status.changes.labels(fields["kind"], result).inc()
        self.log.write("change", **fields, result=result, **more)
        return result

    def _apply(self, change: Change, edit: Edit) -> _Outcome:
        """EDIT and its update, once the lock is free; the edit undone unless
        the update succeeded."""
        opts = self.options
        deadline = self.clock.monotonic() + opts.lock_timeout
        delay = opts.lock_poll
        seen: object = _NOBODY
        stale: str | None = None  # shown by the status until the next look
        try:
            while True:
                holder = self.stack.lock_holder()
                if holder is None:
                    try:
                        return self._attempt(change, edit)
                    except StackBusy as busy:
                        holder = busy.holder or ""
                if holder != seen:
                    seen = holder
                    self.status.set(waitingFor=holder or "unknown")
                    self.status.waiting.set(1)
                    self.log.write(
                        "wait",
                        holder=holder or "unknown",
                        reason=(
                            "its holder is dead: the change is given up, the lock left to the operator"
                            if isinstance(holder, StaleHolder)
                            else "another operation holds the stack's lock; waiting, never cancelling it"
                        ),
                        message=change.message,
                    )
                if isinstance(holder, StaleHolder):
                    # A dead holder never frees its lock: no wait for it.
                    stale = holder
                    return _Outcome("stale-lock", error=holder)
                if self.clock.monotonic() >= deadline:
                    return _Outcome(
                        "lock-timeout",
                        error=f"the lock stayed held {opts.lock_timeout:.0f}s; tried again next round",
                    )
                self.clock.sleep(delay)
                delay = min(delay * 2, opts.lock_poll_max)
        finally:
            self.status.set(waitingFor=stale)
            self.status.waiting.set(0)

    def _attempt(self, change: Change, edit: Edit) -> _Outcome:
        """The refresh EDIT asks for, then the edit and its update; the edit
        undone unless the update succeeded. StackBusy: nothing changed."""
        try:
            if edit.refresh:
                self.stack.refresh(edit.refresh)
        except UpdateFailed as failed:
            return _Outcome("failed", error=f"its refresh: {failed}")
        self.stack.set_config(edit.path, edit.after)
        if not edit.targets:
            # Nothing deployed changes (replicas never deployed leave): an
            # update without targets would be a whole `up`.
            return _Outcome("applied", error=None)
        try:
            updated = self.stack.update(
                change.message, edit.targets, edit.registers, checkpoints=edit.checkpoints
            )
        except StackBusy:
            self.stack.set_config(edit.path, edit.before)
            raise
        except UpdateFailed as failed:
            self.stack.set_config(edit.path, edit.before)
            return _Outcome("failed", error=str(failed))
        return _Outcome("applied", updated.id, None, updated.changes, updated.started)

    # -- the loop ------------------------------------------------------------------------

    def run(self, interval: float, rounds: int | None = None) -> None:
        """Rounds every INTERVAL seconds (ROUNDS of them, None: for ever); a
        round's error is logged and the next round comes."""
        done = 0
        while (rounds is None or done < rounds) and not self.stopping:
            started = self.clock.monotonic()
            try:
                self.round()
            except Exception as error:  # a round's failure must not end the autopilot
                self.status.rounds.labels("error").inc()
                self.status.set(lastRound={"at": self.clock.now().isoformat(), "result": "error"})
                self.log.write("round", result="error", error=f"{type(error).__name__}: {error}")
            done += 1
            # In slices, so that a stop is seen within a second.
            while (rounds is None or done < rounds) and not self.stopping:
                left = interval - (self.clock.monotonic() - started)
                if left <= 0:
                    break
                self.clock.sleep(min(left, 1.0))


_NOBODY = object()
_APPLYING = ("kind", "rule", "group", "proxies", "message")  # an `applying` line's fields


def _recent(failures: Mapping[str, Sequence[datetime]], now: datetime) -> dict[str, list[datetime]]:
    """The failures of the last hour, per change (older ones no longer count)."""
    kept = {key: sorted(t for t in times if now - t < HOUR) for key, times in failures.items()}
    return {key: times for key, times in kept.items() if times}
