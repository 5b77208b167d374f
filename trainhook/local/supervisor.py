"""Run the pods' containers as a kubelet would, and end the run as a gang.

Per pod: init containers one by one (sidecars, `restartPolicy: Always`, are started and left running), then all
containers at once; the pod is done when its containers have exited, and its sidecars are then stopped.

Every container is restarted per its pod's restartPolicy (Always, OnFailure, Never) with a short backoff, as the
kubelet restarts it, never kinder. Two kinds of training container:
- Gang-aware ones run under `trainhook-launch run` (the webhook's delivered launcher), whose launcher keeps its
  state in a status file the runner names in TRAINHOOK_LOCAL_STATUS (RUN_DIR/pods/POD/status/CONTAINER.json).
  They stop being restarted once their gang's outcome is known. Their failures do not stop the run: their
  launchers coordinate the gang. The run ends when every pod is settled: its containers have exited for good,
  or its launcher is parked (the gang is done and the launcher stays up so that its container is not rerun);
  parked containers are then stopped. The run's outcome is the gangs' outcome, as their launchers recorded it.
- Any other training container (a gang opted out with `trainhook.dev/launcher: none`) is restarted whatever
  its exit when its restartPolicy says so, exactly as a kubelet would: a StatefulSet's finished training runs
  again, and the run then ends only on its timeout. Where no restart follows (restartPolicy Never), the runner
  keeps its own gang rule: the first failure stops every pod.
The run also ends on the timeout, or on SIGINT/SIGTERM.

A container's process is started in its own session, and when it exits every process of that session is killed,
as a runtime tears a container down when its main process ends (the launcher puts the training in its own
process group, within the container's session). SIGTERM goes to the main process only, as the kubelet sends it,
so the program gets the chance to forward it (torchrun does).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path

from trainhook.gang.keys import TH_LOCAL_STATUS
from trainhook.local.containers import TH_LOCAL_CONTAINER, _kill_session, exit_code, exited, restarts  # noqa: F401
from trainhook.local.outcome import gang_line, gang_outcomes, run_outcome
from trainhook.local.pods import ContainerSpec, LocalPod
from trainhook.local.results import ContainerResult, Output, PodResult, RunResult  # noqa: F401 - re-exported

EXIT_TIMEOUT = 124
RESTART_BACKOFF, MAX_BACKOFF = 0.5, 10.0  # the kubelet's is 10 s doubling to 5 min; a local run keeps it short
WATCH_EVERY = 0.2
# After a member fails, the other containers get this long to end on their own before the runner stops them.
FAILURE_SETTLE = 2.0
PARKED = "parked"


class Supervisor:
    """A kubelet for the run's pods (the module docstring says how it restarts and ends them)."""

    def __init__(self, pods: list[LocalPod], output: Output, timeout: float | None = None,
                 grace_seconds: float | None = None, restart_policies: dict[str, str] | None = None,
                 run_dir: Path | None = None):
        self.pods = pods
        self.output = output
        self.timeout = timeout
        self.grace_override = grace_seconds
        self.restart_policies = restart_policies or {}  # pod name -> spec.restartPolicy; Never when absent
        self.run_dir = run_dir or output.log_dir.parent
        self.results = {p.name: PodResult(p.name, p.rank, training=p.training_container.name if p.containers else "")
                        for p in pods}
        self._settled: set[str] = set()  # pods whose containers have exited for good
        self._parked: set[str] = set()  # pods whose launchers were parked when the run ended
        self._live: dict[asyncio.subprocess.Process, LocalPod] = {}
        self._records: dict[asyncio.subprocess.Process, ContainerResult] = {}
        self._marks: dict[int, str] = {}  # main process pid -> its container's TH_LOCAL_CONTAINER
        self._stopping = False
        self._deleted: set[str] = set()  # pods deleted while running (a StatefulSet scaled down)
        self._pod_tasks: list[asyncio.Task] = []
        self._by_name: dict[str, asyncio.Task] = {}
        self._reason = "Succeeded"
        self._exit_code = 0
        self._first_failure = ""
        self._stop_tasks: set[asyncio.Task] = set()

    # --- entry --------------------------------------------------------------------------------------------
    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        handled = []
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            try:
                loop.add_signal_handler(signum, self._interrupted, code)
                handled.append(signum)
            except (RuntimeError, ValueError):  # not the main thread: the caller handles signals
                pass
        for pod in self.pods:  # a kept --workdir must not carry an earlier run's launcher states
            for spec in pod.containers:
                self.status_path(pod, spec).unlink(missing_ok=True)
        self._pod_tasks = [asyncio.create_task(self._run_pod(pod)) for pod in self.pods]
        self._by_name = {pod.name: task for pod, task in zip(self.pods, self._pod_tasks)}
        watcher = asyncio.create_task(self._watch_gangs())
        try:
            await self._wait_pods()
            await asyncio.gather(*self._pod_tasks)  # re-raise an unexpected error from a pod task
            while self._stop_tasks:
                await asyncio.gather(*list(self._stop_tasks))
        finally:
            watcher.cancel()
            for signum in handled:
                loop.remove_signal_handler(signum)
            self.kill_all()
        return self._outcome()

    async def _wait_pods(self) -> None:
        """Until every pod's task is done, including pods added while running (add_pod); the timeout stops all."""
        end = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            pending = [task for task in self._pod_tasks if not task.done()]
            if not pending:
                return
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0 and not self._stopping:
                self._stop("Timeout", EXIT_TIMEOUT, f"timed out after {self.timeout:g}s")
                left = None
            await asyncio.wait(pending, timeout=None if left is None else max(left, 0.01),
                               return_when=asyncio.FIRST_COMPLETED)

    # --- a StatefulSet scaled while running: pods come and go, as its controller creates and deletes them --
    async def add_pod(self, pod: LocalPod, restart_policy: str) -> None:
        """Run a pod created while the run goes on (a scale-up). A deleted pod of the same name (scaled down,
        then up again) is replaced once it is gone, as the StatefulSet controller creates the new pod only then."""
        old = self._by_name.get(pod.name)
        if old is not None and not old.done():
            await asyncio.wait([old])
        if self._stopping:
            return
        self.pods = [p for p in self.pods if p.name != pod.name] + [pod]
        self._deleted.discard(pod.name)
        self._settled.discard(pod.name)
        self.restart_policies[pod.name] = restart_policy
        self.results[pod.name] = PodResult(pod.name, pod.rank, training=pod.training_container.name
                                           if pod.containers else "")
        for spec in pod.containers:
            self.status_path(pod, spec).unlink(missing_ok=True)  # the deleted pod's launcher state is not this one's
        task = asyncio.create_task(self._run_pod(pod))
        self._by_name[pod.name] = task
        self._pod_tasks.append(task)

    async def wait_gone(self, names: list[str]) -> None:
        """Until the pods of these names that are still running (deleted, stopping) have ended."""
        tasks = [self._by_name[n] for n in names if n in self._by_name and not self._by_name[n].done()]
        if tasks:
            await asyncio.wait(tasks)

    def delete_pod(self, name: str) -> None:
        """Delete a running pod, as the kubelet does for a deleted pod: SIGTERM to every container's main
        process, SIGKILL after the pod's grace period, and no restart."""
        self._deleted.add(name)
        for proc, pod in list(self._live.items()):
            if pod.name == name:
                self._terminate_later(proc, pod)

    # --- gangs: the launchers' status files ---------------------------------------------------------------
    def status_path(self, pod: LocalPod, spec: ContainerSpec) -> Path:
        return self.run_dir / "pods" / pod.name / "status" / f"{spec.name}.json"

    def read_status(self, pod: LocalPod) -> dict | None:
        """The training container's launcher state (gang_run.Member.status), or None when it keeps none."""
        if not pod.containers:
            return None
        try:
            data = json.loads(self.status_path(pod, pod.training_container).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def _watch_gangs(self) -> None:
        """End the run once every pod is settled and some are parked (parked launchers never exit alone)."""
        while not self._stopping:
            await asyncio.sleep(WATCH_EVERY)
            states = {pod.name: self.read_status(pod) for pod in self.pods}
            parked = {name for name, state in states.items() if state and state.get("state") == PARKED
                      and state.get("outcome") and self._alive(name)}
            if parked and all(pod.name in self._settled or pod.name in parked for pod in self.pods):
                self._parked = parked
                self.output.line(b"", b"trainhook local: every gang is done and every pod has exited or parked; "
                                      b"stopping the parked pods")
                self._stop("Succeeded", 0, "")
                return

    def _alive(self, pod_name: str) -> bool:
        return any(pod.name == pod_name for pod in self._live.values())

    def _outcome(self) -> RunResult:
        pods = [self.results[p.name] for p in self.pods]
        gangs = gang_outcomes(self.pods, self.results, self._parked, self.read_status)
        for name, outcome in gangs.items():
            self.output.line(b"", gang_line(name, outcome).encode())
        return run_outcome(pods, gangs, self._reason, self._exit_code, self._first_failure)

    def kill_all(self) -> None:
        """SIGKILL every process group still alive (the last resort of every exit path)."""
        for proc in list(self._live):
            _kill_session(proc.pid, self._marks.get(proc.pid))

    # --- ending the run -----------------------------------------------------------------------------------
    def _interrupted(self, code: int) -> None:
        if self._stopping:
            self.kill_all()  # interrupted while stopping: no more grace
            return
        self._stop("Interrupted", code, f"interrupted by {signal.Signals(code - 128).name}")

    def _stop(self, reason: str, code: int, why: str, settle: float = 0.0) -> None:
        """Stop every running container (SIGTERM, then SIGKILL after the grace period); nothing new starts.
        With `settle`, containers first get that long to end on their own: after a member's failure, a gang's
        own channel (the launchers', MPI's) usually ends the others at once, each with the code the gang
        decided, which the runner's SIGTERM would otherwise race with (no kubelet stops other pods)."""
        if self._stopping:
            return
        self._stopping = True
        self._reason, self._exit_code = reason, code
        if not self._first_failure:
            self._first_failure = why
        for proc, pod in list(self._live.items()):
            self._terminate_later(proc, pod, settle)

    def _terminate_later(self, proc: asyncio.subprocess.Process, pod: LocalPod, settle: float = 0.0) -> None:
        task = asyncio.create_task(self._terminate(proc, pod, settle))
        self._stop_tasks.add(task)
        task.add_done_callback(self._stop_tasks.discard)

    async def _terminate(self, proc: asyncio.subprocess.Process, pod: LocalPod, settle: float = 0.0) -> None:
        grace = pod.grace_seconds if self.grace_override is None else self.grace_override
        if settle and proc.returncode is None:
            try:
                await asyncio.wait_for(exited(proc), timeout=settle)
            except asyncio.TimeoutError:
                pass
        if proc.returncode is None and proc in self._records:
            self._records[proc].stopped = True
        if proc.returncode is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(exited(proc), timeout=grace)
            except asyncio.TimeoutError:
                pass
        _kill_session(proc.pid, self._marks.get(proc.pid))

    def _failed(self, pod: LocalPod, spec: ContainerSpec, code: int) -> None:
        if not self._stopping and pod.name not in self._deleted:  # a deleted pod's exit is no failure
            self._stop("Failed", code, f"{pod.name}/{spec.name} exited with {code}", settle=FAILURE_SETTLE)

    # --- pods and containers ------------------------------------------------------------------------------
    async def _run_pod(self, pod: LocalPod) -> None:
        """A kubelet's pod worker, minus restarts: init containers in order, then every container at once.
        (A restart policy, when added, loops here: rerun a failed container instead of reporting it.)"""
        result = self.results[pod.name]
        sidecars: list[asyncio.Task] = []
        initialized = True
        for spec in pod.init_containers:
            if self._stopping or pod.name in self._deleted:
                initialized = False
                break
            if spec.kind == "sidecar":
                sidecars.append(asyncio.create_task(self._run_container(pod, spec, result)))
                continue
            result.reason = "Init:Running"
            code = await self._run_container(pod, spec, result)
            if code != 0:
                initialized = False
                record = result.containers[-1]
                result.reason = "Terminated" if record.stopped or code is None else "Init:Error"
                self._failed(pod, spec, 1 if code is None else code)
                break
        if initialized and not self._stopping and pod.name not in self._deleted:
            result.reason = "Running"
            await asyncio.gather(*(self._run_restarting(pod, s, result) for s in pod.containers))
            mains = [c for c in result.containers if c.kind == "main"]
            last = {c.name: c for c in mains}.values()  # each container's last run
            result.reason = ("Error" if any(c.failed or (c.gang_aware and c.exit_code and not c.stopped)
                                            for c in last) else
                             "Terminated" if any(c.stopped for c in last) else "Completed")
        elif result.reason in ("Pending", "Init:Running"):
            result.reason = "Terminated" if result.containers else "Pending"
        if pod.name in self._deleted and self.results.get(pod.name) is result:
            result.reason = "Deleted"
        self._settled.add(pod.name)
        await self._stop_sidecars(pod, sidecars)

    async def _run_restarting(self, pod: LocalPod, spec: ContainerSpec, result: PodResult) -> None:
        """Run a container, and run it again as the kubelet would (restartPolicy Always: whatever the exit;
        OnFailure: a non-zero exit), unless it is gang-aware and its gang's outcome is known."""
        backoff = RESTART_BACKOFF
        policy = self.restart_policies.get(pod.name, "Never")
        while True:
            code = await self._run_container(pod, spec, result)
            if code is None or self._stopping or pod.name in self._deleted or not restarts(policy, code):
                return
            prefix = f"[{pod.name}] ".encode()
            if result.containers[-1].gang_aware:
                if (self.read_status(pod) or {}).get("outcome"):
                    self.output.line(prefix, f"trainhook local: container {spec.name} exited with {code} after "
                                             f"its gang's outcome was known; not restarting it (restartPolicy "
                                             f"{policy})".encode())
                    return
                why = ""
            else:
                why = (" as a kubelet would: it does not run under trainhook-launch, so nothing ends its gang"
                       if spec.training else "")
            self.output.line(prefix, f"trainhook local: container {spec.name} exited with {code}; restarting it "
                                     f"in {backoff:g}s (restartPolicy {policy}){why}".encode())
            end = time.monotonic() + backoff
            while time.monotonic() < end and not self._stopping:
                await asyncio.sleep(0.05)
            if self._stopping or pod.name in self._deleted:
                return
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _stop_sidecars(self, pod: LocalPod, sidecars: list[asyncio.Task]) -> None:
        for proc, owner in list(self._live.items()):
            if owner is pod:  # only sidecars can still be running here
                self._terminate_later(proc, pod)
        if sidecars:
            await asyncio.gather(*sidecars)

    async def _run_container(self, pod: LocalPod, spec: ContainerSpec, result: PodResult) -> int | None:
        record = ContainerResult(spec.name, spec.kind)
        result.containers.append(record)
        if self._stopping:
            return None
        prefix = pod.name if spec.training else f"{pod.name}/{spec.name}"
        log_path = self.output.log_path(pod.name, spec.name)
        argv = pod.entry_argv(spec)
        mark = uuid.uuid4().hex  # every process of this container inherits it, whatever session it moves to
        env = {**spec.env, TH_LOCAL_CONTAINER: mark}
        status = self.status_path(pod, spec)
        if spec.training and spec.kind == "main":
            status.parent.mkdir(parents=True, exist_ok=True)
            env[TH_LOCAL_STATUS] = str(status)
        record.started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as e:
            self.output.line(f"[{prefix}] ".encode(), f"cannot start: {e}".encode())
            record.exit_code, record.finished = 128, time.monotonic()
            return record.exit_code
        self._live[proc] = pod
        self._records[proc] = record
        self._marks[proc.pid] = mark
        if self._stopping:
            self._terminate_later(proc, pod)
        assert proc.stdout is not None and proc.stderr is not None  # PIPE
        pump = asyncio.create_task(self.output.pump([proc.stdout, proc.stderr], prefix, log_path))
        try:
            returncode = await exited(proc)
        finally:
            # The main process is gone: the rest of the container goes with it.
            _kill_session(proc.pid, self._marks.pop(proc.pid, None))
            self._live.pop(proc, None)
            self._records.pop(proc, None)
        try:
            await asyncio.wait_for(pump, timeout=5)
            await asyncio.wait_for(proc.wait(), timeout=5)  # pipes closed: let asyncio finish the transport
        except asyncio.TimeoutError:
            pass
        record.exit_code, record.finished = exit_code(returncode), time.monotonic()
        record.gang_aware = spec.training and spec.kind == "main" and status.exists()
        final = spec.kind == "init" or not restarts(self.restart_policies.get(pod.name, "Never"), record.exit_code)
        if record.exit_code != 0 and (spec.training or spec.kind == "init") and not record.gang_aware and final:
            self._failed(pod, spec, record.exit_code)
        return record.exit_code
