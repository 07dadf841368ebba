"""Slurm executor: drain and resume nodes and requeue jobs through `scontrol`, the one client every Slurm site has.

scontrol runs as an argv list (never a shell) under a timeout; a failure or a missing binary becomes
`Outcome(ok=False)` carrying scontrol's own message.

What Slurm 22.05 allows, measured: `ExcNodeList` cannot change on a running job ("Job is no longer pending
execution"), so a job is requeued first and excluded once pending. A requeued job is held ~2 min (BeginTime)
and stays COMPLETING for a moment; `StartTime=now` sticks only once it is PENDING, so we wait for that.
An excluded node stays excluded for that job after `release_node`: a job that needs every node of its
partition then waits forever (BadConstraints); `exclude_node: false` leaves keeping it off to the drain.
Slurm cannot exclude single accelerators, so `Action.accelerators` is not used here.

Options: `scontrol` (path, default "scontrol"), `timeout_seconds` (per call, default 10), `env` (overrides,
e.g. SLURM_CONF), `node_map` (Sentinel node name → Slurm node name; default 1:1), `exclude_node`
(add the node to a moved job's ExcNodeList, default true).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from sentinel.remediation.executors.base import Action, Executor, JobRef, Outcome, register

log = logging.getLogger(__name__)

REASON_MAX_CHARS = 100  # Slurm shows the reason in sinfo -R columns; operators read it there
DETAIL_MAX_CHARS = 400
PENDING_POLL_SECONDS = 0.1
REQUEUEABLE_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "RESIZING"})

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]+")
_NODE_STATE = re.compile(r"(?:^|\s)State=(\S+)")
# the reason runs until Slurm's " [user@time]" stamp (it may itself contain spaces and "key=value")
_NODE_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?: \[[^\]@\s]+@[^\]\s]+\]|$)")


class SlurmError(RuntimeError):
    """scontrol could not answer a query (node_state); actions never raise it."""


@dataclass(frozen=True)
class ScontrolResult:
    ok: bool
    output: str  # stdout when ok; otherwise scontrol's stderr, trimmed to one line, or why it did not run


def one_line(text: str, limit: int = DETAIL_MAX_CHARS) -> str:
    flat = " ".join(_CONTROL_CHARS.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def drain_reason(reason: str) -> str:
    """`sentinel: <reason>` on one short line, so `sinfo -R` shows who drained the node and why."""
    return one_line(f"sentinel: {one_line(reason) or 'no reason given'}", REASON_MAX_CHARS)


def job_field(show_job_line: str, key: str) -> str:
    match = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", show_job_line)
    return match.group(1) if match else ""


@register
class SlurmExecutor(Executor):
    name = "slurm"
    handles = frozenset({"drain_node", "release_node", "move_work"})

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self.scontrol = str(self.options.get("scontrol", "scontrol"))
        self.timeout_seconds = float(self.options.get("timeout_seconds", 10))
        self.env = {str(k): str(v) for k, v in (self.options.get("env") or {}).items()}
        self.node_map = {str(k): str(v) for k, v in (self.options.get("node_map") or {}).items()}
        self.exclude_node = bool(self.options.get("exclude_node", True))
        if self.timeout_seconds <= 0:
            raise ValueError(f"slurm executor: timeout_seconds must be positive, got {self.timeout_seconds}")

    def slurm_node(self, node: str) -> str:
        return self.node_map.get(node, node)

    def execute(self, action: Action) -> Outcome:
        node = self.slurm_node(action.node)
        if action.kind == "drain_node":
            # scontrol strips one leading and one trailing '"' from a reason; wrapping keeps the reason's own
            outcome = self._update_node(node, "State=DRAIN", f'Reason="{drain_reason(action.reason)}"')
        elif action.kind == "release_node":
            outcome = self._release(node)
        elif action.kind == "move_work":
            outcome = self._move_work(node, action.jobs)
        else:
            outcome = Outcome(False, f"slurm executor cannot {action.kind!r}")
        slurm_jobs = [str(j.attributes["slurm_job_id"]) for j in action.jobs if j.attributes.get("slurm_job_id")]
        log.log(logging.INFO if outcome.ok else logging.WARNING,
                "slurm %s: node=%s slurm_node=%s jobs=%s incident=%s ok=%s %s", action.kind, action.node, node,
                ",".join(slurm_jobs) or "-", action.incident_id, outcome.ok, outcome.detail)
        return outcome

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) of a node as Slurm reports it, e.g. ("IDLE+DRAIN", "sentinel: xid 79"); reason is
        "" when none is set. Raises SlurmError when scontrol cannot answer."""
        result = self._scontrol("show", "node", "-o", self.slurm_node(node))
        if not result.ok:
            raise SlurmError(result.output)
        state = _NODE_STATE.search(result.output)
        if state is None:
            raise SlurmError(f"no State= in scontrol output: {one_line(result.output)}")
        reason = _NODE_REASON.search(result.output)
        return state.group(1), (reason.group(1).strip() if reason else "")

    def _update_node(self, node: str, *fields: str) -> Outcome:
        result = self._scontrol("update", f"NodeName={node}", *fields)
        command = f"scontrol update NodeName={node} {' '.join(fields)}"
        if not result.ok:
            return Outcome(False, f"{command} failed: {result.output}")
        return Outcome(True, command)

    def _release(self, node: str) -> Outcome:
        """RESUME a drained node; one that is not drained (any more) needs nothing, and Slurm would refuse."""
        try:
            state, _ = self.node_state(node)
        except SlurmError:
            state = ""  # let the update say what is wrong (unknown node, scontrol missing)
        if state and "DRAIN" not in state:
            return Outcome(True, f"node {node} is not drained ({state}): nothing to resume")
        return self._update_node(node, "State=RESUME")

    def _move_work(self, node: str, jobs: tuple[JobRef, ...]) -> Outcome:
        known = self._scontrol("show", "node", "-o", node)
        if not known.ok:  # before any requeue: a job must not be moved off a node Slurm does not have
            return Outcome(False, one_line(f"move_work node {node}: {known.output}"))
        done: list[str] = []
        failed: list[str] = []
        skipped = [f"{j.id} ({j.name})" for j in jobs if not j.attributes.get("slurm_job_id")]
        for job in jobs:
            slurm_id = job.attributes.get("slurm_job_id")
            if slurm_id:
                ok, what = self._move_job(node, str(slurm_id))
                (done if ok else failed).append(what)
        parts = [f"failed: {'; '.join(failed)}"] if failed else []
        parts += [f"done: {'; '.join(done)}"] if done else []
        parts += [f"skipped, no slurm_job_id: jobs {', '.join(skipped)}"] if skipped else []
        return Outcome(not failed, one_line(f"move_work node {node}: " + (" | ".join(parts) or "no jobs to move")))

    def _move_job(self, node: str, job_id: str) -> tuple[bool, str]:
        """Requeue a running job, then (once pending) exclude `node` and make it eligible now."""
        shown = self._scontrol("show", "job", "-o", job_id)
        if not shown.ok:
            return False, f"job {job_id}: {shown.output}"
        state = job_field(shown.output, "JobState")
        if state in REQUEUEABLE_STATES:
            requeued = self._scontrol("requeue", job_id)
            if not requeued.ok:
                return False, f"job {job_id}: requeue failed: {requeued.output}"
            steps = [f"job {job_id} requeued"]
        elif state == "PENDING":
            steps = [f"job {job_id} already pending"]
        else:
            return True, f"job {job_id} not requeued: {state or 'unknown state'}"
        pending_line = self._wait_until_pending(job_id)
        if self.exclude_node:
            excluded = self._exclude(job_id, node, job_field(pending_line or shown.output, "ExcNodeList"))
            if not excluded.ok:
                return False, "; ".join([*steps, f"ExcNodeList failed: {excluded.output}"])
            steps.append(f"ExcNodeList+={node}")
        if pending_line is None:
            steps.append("still completing: left in BeginTime (~2 min)")
        elif not (now := self._scontrol("update", f"JobId={job_id}", "StartTime=now")).ok:
            steps.append(f"StartTime=now failed: {now.output}")
        return True, ", ".join(steps)

    def _exclude(self, job_id: str, node: str, current: str) -> ScontrolResult:
        existing = "" if current in ("", "(null)") else current
        if node in existing.split(","):
            return ScontrolResult(True, "")
        return self._scontrol("update", f"JobId={job_id}", f"ExcNodeList={existing + ',' if existing else ''}{node}")

    def _wait_until_pending(self, job_id: str) -> str | None:
        """The job's `show job -o` line once it is PENDING, or None if it is not within timeout_seconds."""
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            shown = self._scontrol("show", "job", "-o", job_id)
            if shown.ok and job_field(shown.output, "JobState") == "PENDING":
                return shown.output
            if time.monotonic() >= deadline:
                return None
            time.sleep(PENDING_POLL_SECONDS)

    def _scontrol(self, *args: str) -> ScontrolResult:
        argv = [self.scontrol, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_seconds,
                                  env={**os.environ, **self.env}, check=False)
        except FileNotFoundError:
            return ScontrolResult(False, f"scontrol not found: {self.scontrol!r} (is Slurm's client installed?)")
        except OSError as exc:
            return ScontrolResult(False, f"scontrol could not run: {self.scontrol!r}: {exc.strerror or exc}")
        except subprocess.TimeoutExpired:
            return ScontrolResult(False, f"scontrol {' '.join(args[:2])} timed out after {self.timeout_seconds:g}s")
        if done.returncode != 0:
            message = one_line(done.stderr or done.stdout) or f"exit status {done.returncode}"
            return ScontrolResult(False, message)
        return ScontrolResult(True, done.stdout.strip())
