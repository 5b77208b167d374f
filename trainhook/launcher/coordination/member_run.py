"""`trainhook-launch run -- CMD` inside a gang: every member's training starts, ends and restarts as one.

Each member's launcher keeps a connection to the gang's coordinator (rank 0's launcher, coordinator.py) and
runs the training command only when told to (`start`, with the attempt number), stops it when told to (`stop`:
SIGTERM, SIGKILL after TRAINHOOK_STOP_GRACE), and reports everything that happens to it. When the coordinator
announces the outcome (`done`), the launcher ends its training (after TRAINHOOK_FINISH_GRACE when the gang
succeeded, at once when it failed) and then:

- in a pod whose containers are not restarted (a Job's: restartPolicy Never or OnFailure) it exits: 0 when the
  gang succeeded, else the gang's exit code;
- in a pod whose containers are restarted (restartPolicy Always: a StatefulSet's), exiting would rerun the
  training, so it parks: it stays up, says why, and exits only when the pod is stopped. Only the coordinator
  records the outcome, through the notary (ending.record_through_notary), which annotates the gang's workloads, scales
  a StatefulSet to zero and emits an Event; the pods themselves hold no Kubernetes permission.

The gang's signing key comes from the notary too (notary_client.py, asked once at start with the pod's projected
identity token): it stays in this process's memory, never in the training command's environment or a file.

A launcher that starts asks before it runs anything: the outcome marker in TRAINHOOK_STATE_DIR (an emptyDir
outlives container restarts), the notary's record (rank 0: GET /v1/outcome), and the coordinator, which tells a
member that joins late that the gang is done, or that it already finished its part. So a restarted container
never reruns finished training. What a member claims about the outcome is never taken as the outcome.

Rank 0's launcher connects to its own coordinator over loopback, so every member takes the same path.

This module is the member's event loop; its link to the coordinator is gang_link.py, and how it ends (the outcome
marker, the notary's record, exit or park) is ending.py, shared with the MPI commands.
"""

from __future__ import annotations

import os
import queue
import signal
import time

from trainhook.gang import keys
from trainhook.launcher import ending, files
from trainhook.launcher.coordination import failure_cause
from trainhook.launcher import notary_client, progress
from trainhook.launcher.pod_view import ConfigError, GangView, parse_gang
from trainhook.launcher.coordination.link import Link
from trainhook.launcher.coordination.report import DONE, EXITED, RUNNING, STOPPED, Report
from trainhook.launcher.outcome import EXIT_NOT_ASSEMBLED, Outcome, now_rfc3339
from trainhook.launcher.policy import LaunchSettings, attempt_env, read_settings
from trainhook.launcher.process import FORWARDED, Training, reap_exited, run_command
from trainhook.launcher.speak import speaker

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:  # only rank 0 runs a coordinator: a member's start does not import it (issue 26)
    from typing import Mapping, Sequence
    from trainhook.launcher.coordination.coordinator import Coordinator

POLL = 0.2  # while PID 1 with no training: how often orphans are reaped
# The loop's sleep when no timer is due (a safety net: what changes a timer comes as an event). Waking every POLL
# cost an idle launcher ~0.75 ms of CPU a second on the 2-core test machine (issue 32).
MAX_WAIT = 5.0
DELIVERY_TIMEOUT = 10.0  # how long rank 0 waits for every member to hear the outcome before it leaves

say = speaker("run")


class MemberLauncher:
    """One member's launcher: the event loop around its training."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], gang: GangView, settings: LaunchSettings,
                 notary: notary_client.NotaryClient | None = None):
        self.argv, self.env, self.gang, self.settings = list(argv), dict(env), gang, settings
        self.notary = notary
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.report = Report()
        self.training: Training | None = None
        self.stopping = False
        self.kill_at: float | None = None
        self.finish_at: float | None = None
        self.outcome: Outcome | None = None
        self.terminating: int | None = None
        self.connected = False
        self.disconnected_since = time.monotonic()
        self.last_code: int | None = None
        self.joined_once = False
        self.coordinator: Coordinator | None = None
        self.link = Link(gang, settings, self.events, self.report)
        self.pid1 = os.getpid() == 1
        self.error_directory: str | None = None  # error_dir(); removed when the launcher ends
        self.error_file, self.started_at = "", 0.0
        self.progress: progress.Forwarder | None = None

    # --- entry ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        previous = {s: signal.signal(s, lambda signum, _f: self.events.put(("signal", signum))) for s in FORWARDED}
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.link.close()
            if self.coordinator is not None:
                self.coordinator.close()
            if self.error_directory:
                files.remove_tree(self.error_directory)

    def _run(self) -> int:
        gang, settings = self.gang, self.settings
        members = (f"elastic: {gang.elastic[0]} to {gang.elastic[1]} members" if gang.elastic else
                   f"{gang.size} members")
        say(f"{gang.me} of {gang.namespace}/{gang.job_name} ({members}); on failure: "
            f"{settings.policy.on_failure}" + (f" (max {settings.policy.max_restarts} restarts)"
                                               if settings.policy.on_failure == "restart-gang" else "")
            + (f"; active deadline {settings.policy.deadline:g}s" if settings.policy.deadline else ""))
        known = ending.read_marker(self.settings, self.gang, say)
        if gang.rank == 0:
            known = known or ending.recorded_outcome(self.notary, self.settings, say)
            # rank 0's alone: members never import it
            from trainhook.launcher.coordination.coordinator import Coordinator
            notary = self.notary  # the gang's restarts become Events, sent on a thread of their own

            def notify(type_: str, reason: str, message: str) -> None:
                notary_client.emit_in_background(notary, type_, reason, message, log=say)

            self.coordinator = Coordinator(gang, settings.policy, settings.key, settings.port, notify=notify)
            try:
                self.coordinator.start()
            except OSError as e:
                say(f"cannot listen on the coordinator port {settings.port}: {e.strerror or e}")
                return EXIT_NOT_ASSEMBLED
            if known is not None:
                self.coordinator.adopt(known, "this pod's outcome marker or the notary's record")
        if known is not None:
            self.outcome = known
            self.report.status, self.report.outcome = DONE, known.to_dict()
            self.link.latest = self.report.to_dict()
        self.status("joining")
        self.link.start()
        if self.outcome is not None:
            say(f"not running the training: {self.outcome.summary()}")
            return self.finalize(announce=False)
        if self.coordinator is not None and self.notary is not None:  # rank 0 forwards the training's progress
            self.progress = progress.watch(self.env, self.notary.report_progress)
        while True:
            try:
                event = self.events.get(timeout=self.until_timers())
            except queue.Empty:
                event = None
            if event is not None:
                result = self.handle(event)
                if result is not None:
                    return result
            result = self.timers()
            if result is not None:
                return result

    # --- events -----------------------------------------------------------------------------------------------
    def handle(self, event: tuple) -> int | None:
        kind = event[0]
        if kind == "signal":
            signum = event[1]
            if signum in (signal.SIGTERM, signal.SIGINT) and self.gang.elastic and self.gang.rank != 0 \
                    and self.outcome is None and self.terminating is None:
                # Before the training sees the signal: the gang must hear "leaving", not "failed".
                say(f"stopped by {signal.Signals(signum).name}: leaving the elastic gang (a scale-down, or this pod "
                    f"is being deleted); the others go on without it")
                self.link.leave(f"{self.gang.me.role}-{self.gang.me.index} got {signal.Signals(signum).name}")
            if self.training is not None:
                self.training.signal(signum)
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.terminating = signum
                if self.training is None:
                    say(f"stopped by {signal.Signals(signum).name} before the training ran")
                    return 128 + signum
            return None
        if kind == "connected":
            self.connected = True
            return None
        if kind == "lost":
            self.connected, self.disconnected_since = False, time.monotonic()
            if self.outcome is None:
                say(f"lost the gang's coordinator ({event[1]})"
                    + ("; stopping the training: the gang cannot go on without rank 0's launcher"
                       if self.training is not None and not self.stopping else "; reconnecting"))
                if self.training is not None:
                    self.stop_training()
            return None
        if kind == "exited":
            return self.exited(event[1], event[2])
        if kind == "directive":
            return self.directive(event[1])
        return None

    def directive(self, body: dict) -> int | None:
        kind = body.get("type")
        if kind == "welcome":
            if body.get("finished") and self.training is None:
                self.report.attempt, self.report.status, self.report.code = int(body["attempt"]), EXITED, 0
                self.last_code = 0
                self.link.update(self.report)
                say(f"this member already finished its part of attempt {body['attempt']}: not running it again; "
                    f"waiting for the gang")
                self.status("waiting")
            elif not self.joined_once:
                say(f"joined the gang's coordinator ({body.get('phase')}; waiting for every member to start)"
                    if body.get("phase") == "assembling" else f"joined the gang's coordinator ({body.get('phase')})")
            self.joined_once = True
            return None
        if kind == "start":
            if self.training is not None:
                return None
            attempt = int(body["attempt"])
            self.report.attempt, self.report.restarts, self.report.since = attempt, int(body.get("restarts", 0)), \
                body.get("since")
            self.start_training(attempt)
            return None
        if kind == "stop":
            if self.training is not None and self.report.attempt == body.get("attempt") and not self.stopping:
                say(f"stopping the training of attempt {self.report.attempt}: {body.get('why')}")
                self.stop_training()
            elif self.training is None:
                self.link.update(self.report)
            return None
        if kind == "done":
            try:
                self.outcome = Outcome.from_dict(body.get("outcome") or {})
            except ValueError as e:
                say(f"ignored a malformed outcome from the coordinator: {e}")
                return None
            say(self.outcome.summary())
            ending.write_marker(self.settings, self.gang, self.outcome, say)
            if self.training is None:
                return self.finalize()
            if self.outcome.succeeded and not self.stopping:
                self.finish_at = time.monotonic() + self.settings.finish_grace
                say(f"rank 0 succeeded: this member's training gets {self.settings.finish_grace:g}s to finish")
            elif not self.stopping:
                say("stopping the training: the gang failed")
                self.stop_training()
            return None
        return None

    def exited(self, attempt: int, code: int) -> int | None:
        if self.training is not None:  # its last lines go with its exit report (kept with a failed outcome)
            tail = self.training.tail()
            self.report.tail, self.report.cause = tail, failure_cause.command_missing(code, tail)
            if code and not self.stopping:  # what torchrun's exit 1 hides: a worker's signal, a lost peer
                code = self.judge(code, self.report.tail)
        self.training, self.last_code = None, code
        self.report.status = STOPPED if self.stopping else EXITED
        self.report.code = code
        self.stopping, self.kill_at, self.finish_at = False, None, None
        say(f"the training of attempt {attempt} {'was stopped' if self.report.status == STOPPED else 'exited'} "
            f"with {code}")
        if self.outcome is not None:
            return self.finalize()
        self.link.update(self.report)
        if self.terminating is not None:
            if self.coordinator is not None:
                self.coordinator.wait_delivered(2.0)  # let the gang hear about it before the coordinator goes
            return code
        self.status("waiting")
        return None

    def until_timers(self) -> float:
        """Seconds until timers() may have something to do: the nearest of its deadlines, POLL while it reaps as
        PID 1, MAX_WAIT when nothing is due (what changes a deadline comes as an event, which ends the wait)."""
        now, due = time.monotonic(), [MAX_WAIT]
        if self.training is not None:
            due += [at - now for at in (self.kill_at, self.finish_at) if at is not None]
        elif self.pid1:
            due.append(POLL)
        if self.training is None and self.outcome is None and not self.connected:
            due.append(self.disconnected_since + self.settings.policy.join_timeout - now)
        return max(0.01, min(due))  # a deadline just passed: timers() runs next, without a busy loop

    def timers(self) -> int | None:
        now = time.monotonic()
        if self.training is not None and self.kill_at is not None and now >= self.kill_at:
            say(f"the training did not stop within {self.settings.stop_grace:g}s of SIGTERM: SIGKILL")
            self.training.kill_group()
            self.kill_at = None
        if self.training is not None and self.finish_at is not None and now >= self.finish_at:
            say(f"the training is still running {self.settings.finish_grace:g}s after rank 0 succeeded: "
                f"stopping it")
            self.finish_at = None
            self.stop_training()
        if self.training is None and self.outcome is None and not self.connected \
                and now - self.disconnected_since > self.settings.policy.join_timeout:
            say(f"gave up: the gang's coordinator (rank 0 at {self.link.address}:{self.settings.port}) has not "
                f"been reachable for {self.settings.policy.join_timeout:g}s: {self.link.last_error}")
            self.status("exiting")
            return EXIT_NOT_ASSEMBLED
        if self.pid1 and self.training is None:
            reap_exited()
        return None

    # --- the training -----------------------------------------------------------------------------------------
    def start_training(self, attempt: int) -> None:
        say(f"attempt {attempt}: starting the training" + (f" (gang restart {attempt - 1})" if attempt > 1 else ""))
        env, self.error_file = failure_cause.error_file_env(attempt_env(self.env, attempt), self.error_dir(), attempt)
        self.started_at = time.time()
        training = Training(self.argv, env, lambda code: self.events.put(("exited", attempt, code)))
        self.report.tail, self.report.cause, self.report.symptom = None, "", ""
        failed = training.start()
        if failed is not None:
            self.report.status, self.report.code, self.last_code = EXITED, failed, failed
            self.report.tail, self.report.cause = "", training.cause
            self.link.update(self.report)
            return
        self.training = training
        self.report.status, self.report.code = RUNNING, None
        self.link.update(self.report)
        self.status("running")

    def error_dir(self) -> str:
        """A private directory for torchrun's error files (failure_cause), made once; "" when none can be."""
        if self.error_directory is None:
            try:
                self.error_directory = files.private_directory("trainhook-launch-")
            except OSError as e:  # a read-only /tmp: the failure is judged by the output alone
                say(f"no directory for torchrun's error file ({e.strerror or e}); judging failures by the output")
                self.error_directory = ""
        return self.error_directory

    def judge(self, code: int, tail: str) -> int:
        """The training's code as the gang judges it (failure_cause.judge): torchrun's exit 1 for a worker killed
        by SIGKILL becomes 137, and a lost peer or a timeout is named for the failure rules."""
        cause = failure_cause.judge(code, tail, failure_cause.read_error_file(self.error_file, self.started_at))
        self.report.symptom = cause.symptom
        if cause.detail:
            self.report.cause = self.report.cause or cause.detail
            say(f"the training exited with {code}: {cause.detail}" + (f"; reporting exit {cause.code}"
                                                                       if cause.code != code else ""))
        return cause.code

    def stop_training(self) -> None:
        if self.training is None:
            return
        self.stopping = True
        self.training.signal(signal.SIGTERM)
        self.kill_at = time.monotonic() + self.settings.stop_grace
        self.status("stopping")

    # --- the end ----------------------------------------------------------------------------------------------
    def finalize(self, announce: bool = True) -> int:
        """The gang is done and this member's training has ended: acknowledge, record, then exit or park.
        Rank 0 first waits (a while) for every member to hear the outcome it `announce`s."""
        outcome = self.outcome
        assert outcome is not None
        progress.stop(self.progress)  # the training's last report lands before the outcome is recorded
        self.report.status, self.report.outcome = DONE, outcome.to_dict()
        self.link.update(self.report)
        self.link.quiet = True
        if announce and self.coordinator is not None and not self.coordinator.wait_delivered(DELIVERY_TIMEOUT):
            missing = [str(self.gang.peers[r]) for r, rec in enumerate(self.coordinator.state.records)
                       if not rec.acked]
            say(f"not every member acknowledged the outcome within {DELIVERY_TIMEOUT:g}s: {', '.join(missing)}")
        code = 0 if outcome.succeeded else outcome.code
        return ending.exit_or_park(self.settings, code, self.record_outcome(outcome), self.status,
                                   self.wait_for_stop, say)

    def wait_for_stop(self) -> int:
        """Parked: wait on the event queue (the signal handlers feed it) for SIGTERM or SIGINT, reaping as PID 1."""
        while True:
            try:
                event = self.events.get(timeout=1.0 if self.pid1 else MAX_WAIT)
            except queue.Empty:
                event = None
            if event is not None and event[0] == "signal" and event[1] in (signal.SIGTERM, signal.SIGINT):
                return event[1]
            if self.pid1:
                reap_exited()

    def record_outcome(self, outcome: Outcome) -> str:
        """Only the coordinator records the outcome, through the notary (ending.record_through_notary), with what a
        finished gang is inspected by: when its first attempt started, and the last lines of the rank that
        decided it and of rank 0 (its own, taken here: its report may still be on the loopback)."""
        details: dict = {}
        if self.coordinator is not None:
            state = self.coordinator.state
            if state.since is not None:
                details["started"] = now_rfc3339(state.since)
            tails = dict(state.tails)
            if self.report.tail is not None:
                tails[self.gang.rank] = self.report.tail
            details["logs"] = {str(rank): tails[rank] for rank in dict.fromkeys((outcome.rank, 0)) if rank in tails}
        return ending.record_through_notary(self.gang, self.settings, outcome, say, self.notary, details)

    # --- the local runner's status -------------------------------------------------------------------------
    def status(self, state: str) -> None:
        """The launcher's state for `trainhook local` (TRAINHOOK_LOCAL_STATUS); nothing in a cluster."""
        ending.write_local_status(self.settings, ending.status_document(
            self.gang, state, self.outcome, self.report.attempt, self.last_code), say)


def run_gang(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """The `run` command in a gang (ConfigError for a bad environment, which the CLI prints)."""
    gang = parse_gang(env)
    settings = read_settings(env, gang)
    try:
        notary = notary_client.from_settings(settings)
    except notary_client.NotaryError as e:
        raise ConfigError(str(e)) from None
    if notary is None:
        say(f"{keys.TH_NOTARY} is not set (a webhook without a notary?): running the command without gang "
            f"coordination")
        return run_command(argv, env)
    if not argv:
        raise ConfigError("run needs a command: trainhook-launch run -- CMD [ARGS ...]")
    try:
        key = notary.gang_key(gang.namespace, gang.job_name, settings.policy.join_timeout, say)
    except notary_client.NotaryError as e:
        say(f"cannot join the gang: {e}")
        return EXIT_NOT_ASSEMBLED
    return MemberLauncher(argv, env, gang, settings.replace(key=key), notary).run()
