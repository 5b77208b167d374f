"""A member's real failure, read from what its training left behind: torchrun's report and error file.

torchrun turns every worker failure into its own exit 1: a worker killed by SIGKILL (an OOM kill) or one that
exited 3 both come back as 1, so a rule on the exit code alone would never see the signal. What torchrun knows
it prints as it exits (`Root Cause (first observed failure): ... exitcode : -9 (pid: 123) (SIGKILL)`, and the
agent's log line `failed (exitcode: -9) local_rank: 1`), and writes to TORCHELASTIC_ERROR_FILE when the failure
was an exception it could record (a worker's under torch's `@record`, or torchrun's own: a rendezvous timeout, a
SIGTERM it got). `judge` reads both after the training exited and gives the member's code as the gang should
judge it: a worker's death by signal N is 128+N, a worker's own exit code is that code; and the symptom, when
the failing process's exception says a peer was lost or an operation timed out (failure_rules.LOST_PEER,
TIMEOUT), which a training whose peer died reports as a plain exit 1.

Only exceptions decide the symptom, and only when every exception the output shows has one: a ValueError next
to a "Connection reset by peer" is the program's own failure (its peers lost it), not a lost peer.

Pure (text in, `Cause` out) but for `error_file_env`/`read_error_file`; standard library only. Every gang pod's
launcher start imports it, so `Cause` is a plain class, not a dataclass (issue 32: the dataclasses module with its
`inspect` was several ms of each start's CPU).
"""

from __future__ import annotations

import json
import os
import re

from trainhook.gang.failure_rules import LOST_PEER, TIMEOUT, signal_name
from trainhook.launcher.process import EXIT_NOT_FOUND

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Mapping, Optional

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch.distributed.elastic's error file, read by torchrun and @record
MAX_DETAIL = 200

# The patterns below are text, flags inline, compiled by `re` on their first use (and kept in its cache): only a
# failed training is read, and compiling them all at import was ~1.5 ms of every launcher's start (issue 32).
# torchrun's failure report (torch.distributed.elastic.multiprocessing.errors.ChildFailedError, torch 1.9 to 2.x).
ROOT_CAUSE = r"(?s)Root Cause \(first observed failure\):(.*?)(?:\n=+|\Z)"
EXITCODE = r"exitcode\s*:\s*(-?\d+)"
LOCAL_RANK = r"local_rank:\s*(\d+)|rank\s*:\s*\d+\s*\(local_rank:\s*(\d+)\)"
AGENT_FAILED = r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)"
# torchrun itself stopped by a signal (SignalException), in its error file or its last words.
AGENT_SIGNAL = r"SignalException: Process \d+ got signal: (\d+)"
# The last line of a Python traceback (`RuntimeError: ...`, `torch.distributed.DistNetworkError: ...`), as torch
# prints it, possibly behind its `[rank0]:` prefix.
EXCEPTION = (r"(?m)^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Timeout|Interrupt))"
             r"(?::\s*(.*))?$")
# What is no failure of the training's own: torchrun's summary of its workers, its shutdown on a signal.
NOT_THE_CAUSE = ("ChildFailedError", "SignalException", "KeyboardInterrupt")
PEER_LOST = (r"(?i)connection (?:closed|reset) by peer|broken pipe|remote process exited|ncclRemoteError|"
             r"communicator was aborted|DistNetworkError|RendezvousClosedError|RendezvousConnectionError|"
             r"failed to recv, got 0 bytes|peer (?:closed|hung up)|socket closed")
TIMED_OUT = r"(?i)timed? ?out|timeout|DistStoreError|deadline exceeded"


class Cause:
    """The code the gang judges, the symptom recognized ("" for none) and what was seen, in words. A value: equal
    to a Cause of the same fields."""

    __slots__ = ("code", "symptom", "detail")

    def __init__(self, code: int, symptom: str = "", detail: str = ""):
        self.code, self.symptom, self.detail = code, symptom, detail

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cause) and (self.code, self.symptom, self.detail) == (
            other.code, other.symptom, other.detail)

    def __hash__(self) -> int:
        return hash((self.code, self.symptom, self.detail))

    def __repr__(self) -> str:
        return f"Cause(code={self.code!r}, symptom={self.symptom!r}, detail={self.detail!r})"


def one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL - 3] + "..."


def error_file_message(text: Optional[str]) -> str:
    """The message of a torch error file (`{"message": {"message": "...", "extraInfo": ...}}`), "" if none."""
    if not text:
        return ""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return message if isinstance(message, str) else ""


def torchrun_root_cause(output: str) -> Optional[tuple]:
    """(exit code, local rank or None) of the failure torchrun names as the root cause, if its report is there."""
    blocks = re.findall(ROOT_CAUSE, output)
    if blocks:
        code = re.search(EXITCODE, blocks[-1])
        if code:
            rank = re.search(LOCAL_RANK, blocks[-1])
            return int(code.group(1)), (rank.group(1) or rank.group(2)) if rank else None
    failed = re.search(AGENT_FAILED, output)
    if failed:
        return int(failed.group(1)), failed.group(2)
    return None


def symptom_of(exceptions: list) -> tuple:
    """(symptom, the exception that shows it) when every exception seen is a lost peer's or a timeout's."""
    found = []
    for kind, message in exceptions:
        line = f"{kind}: {message}" if message else kind
        if re.search(PEER_LOST, line):
            found.append((LOST_PEER, line))
        elif re.search(TIMED_OUT, line):
            found.append((TIMEOUT, line))
        else:
            return "", ""
    if not found:
        return "", ""
    lost = [line for symptom, line in found if symptom == LOST_PEER]
    return (LOST_PEER, lost[-1]) if lost else found[-1]


def judge(code: int, output: str = "", error_file: Optional[str] = None) -> Cause:
    """The member's failure as the gang should judge it, from the training's exit code, the last of its output
    and the text of the error file it left (None when none)."""
    if code == 0 or code >= 128:
        return Cause(code)  # its own death by signal, or success: nothing hides behind it
    message = error_file_message(error_file)
    detail = ""
    root = torchrun_root_cause(output)
    if root is not None and root[0] != 0:
        worker, local_rank = root
        who = f"torchrun: local rank {local_rank}'s worker" if local_rank is not None else "torchrun: its worker"
        if worker < 0:
            code = 128 - worker
            return Cause(code, "", f"{who} was killed by {signal_name(code) or f'signal {-worker}'}")
        code, detail = worker, f"{who} exited with {worker}"
    else:
        stopped = re.search(AGENT_SIGNAL, message) or re.search(AGENT_SIGNAL, output)
        if stopped:
            code = 128 + int(stopped.group(1))
            return Cause(code, "", f"torchrun was stopped by {signal_name(code) or 'a signal'}")
    exceptions = [(kind, text or "") for kind, text in re.findall(EXCEPTION, output)
                  if kind.rsplit(".", 1)[-1] not in NOT_THE_CAUSE]
    if message:
        head = message.strip().splitlines()[0] if message.strip() else ""
        kind, _, text = head.partition(": ")
        if kind.rsplit(".", 1)[-1] not in NOT_THE_CAUSE:
            exceptions.append((kind, text))
    symptom, line = symptom_of(exceptions)
    if symptom:
        detail = f"{detail}: {line}" if detail else line
    return Cause(code, symptom, one_line(detail))


def error_file_env(env: Mapping[str, str], directory: str, attempt: int) -> tuple:
    """(the training's environment, the error file to read after it): TORCHELASTIC_ERROR_FILE in `directory`,
    unless the user set one (then theirs is read). Without a directory, nothing is added."""
    given = env.get(ERROR_FILE, "").strip()
    if given:
        return dict(env), given
    if not directory:
        return dict(env), ""
    path = os.path.join(directory, f"error-{attempt}.json")
    try:
        os.unlink(path)  # an attempt's file is its own
    except OSError:
        pass
    return {**env, ERROR_FILE: path}, path


def read_error_file(path: str, since: float) -> Optional[str]:
    """The error file's text when it was written at `since` or later (an older one is another run's)."""
    if not path:
        return None
    try:
        if os.stat(path).st_mtime + 1.0 < since:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None


# A missing command as shells and the launcher say it: `exec: torchrun: not found`, `torchrun: command not found`,
# `command not found: torchrun`.
MISSING = r"(?:^|\s|:)([^\s:]+): (?:command )?not found\s*$|command not found: (\S+)"  # text, as above


def command_missing(code: int, tail: str) -> str:
    """`command not found: NAME` when the training exited 127 and its last lines say a command was not found (a
    shell's `exec: torchrun: not found`, bash's `torchrun: command not found`), so the outcome names it."""
    if code != EXIT_NOT_FOUND:
        return ""
    for line in reversed(tail.splitlines()[-5:]):
        found = re.search(MISSING, line)
        if found:
            return f"command not found: {found.group(1) or found.group(2)}"[:200]
    return ""
