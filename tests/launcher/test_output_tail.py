"""The gang-aware launcher's tee (launcher/output_tail.py, launcher/process.py Training): the training's output reaches
the container's stdout and stderr unchanged and at once, and its last lines are kept, bounded, for the outcome.

Real processes: each test runs a real `Training` in a child Python (so its fd 1 and 2 are pipes the test reads, as
a container runtime's are), with a real training command, and checks both what came out and what was kept."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from trainhook.launcher.output_tail import LINE_BYTES, LINES, TAIL_BYTES, Tail, printable

# Runs the command of argv[1:] as one attempt's Training; says its pid on $STARTED_FD, and when it exits writes its
# code and kept tail as JSON on $RESULT_FD (the test's own channels: fd 1 and 2 carry the training's output, which
# must stay as it is).
HARNESS = textwrap.dedent("""
    import json, os, sys, threading
    from trainhook.launcher.process import Training
    done = threading.Event()
    codes = []
    training = Training(sys.argv[1:], dict(os.environ), lambda code: (codes.append(code), done.set()))
    failed = training.start()
    if failed is None:
        os.write(int(os.environ["STARTED_FD"]), json.dumps({"pid": training.proc.pid}).encode() + b"\\n")
        done.wait()
    os.write(int(os.environ["RESULT_FD"]), json.dumps({"code": codes[0] if codes else failed, "tail": training.tail(),
                            "cause": training.cause}).encode())
""")


def run_training(command: list[str], timeout: float = 60, on_start=None) -> tuple[bytes, bytes, dict]:
    """(stdout bytes, stderr bytes, {"code", "tail", "cause"}) of one Training of `command`."""
    import os

    result_r, result_w = os.pipe()
    started_r, started_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(result_w, started_w),
                            env={**os.environ, "RESULT_FD": str(result_w), "STARTED_FD": str(started_w)})
    os.close(result_w)
    os.close(started_w)
    with os.fdopen(started_r) as started:
        line = started.readline()
        if on_start is not None and line:
            on_start(json.loads(line)["pid"])
    out, err = proc.communicate(timeout=timeout)
    with os.fdopen(result_r, "rb") as result:
        return out, err, json.loads(result.read() or b"{}")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_output_passes_through_unchanged_in_order_and_the_last_lines_are_kept():
    out, err, result = run_training(python("""
        import sys
        for i in range(100):
            print(f"line {i}", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        sys.exit(3)
    """))
    assert out == b"".join(f"line {i}\n".encode() for i in range(100))
    assert err == b"to stderr\n"
    assert result["code"] == 3
    kept = result["tail"].splitlines()
    assert len(kept) == LINES
    # each stream's lines in order; the two streams interleave in the order the launcher read them
    assert "to stderr" in kept
    assert [line for line in kept if line != "to stderr"] == [f"line {i}" for i in range(61, 100)]


def test_partial_lines_of_both_streams_are_neither_lost_nor_spliced():
    out, err, result = run_training(python("""
        import os, time
        os.write(1, b"half a li")
        os.write(2, b"err part")
        time.sleep(0.2)
        os.write(1, b"ne\\nno newline at the end")
    """))
    assert out == b"half a line\nno newline at the end"
    assert err == b"err part"
    kept = result["tail"].splitlines()  # in the order read: stdout's two in order, stderr's anywhere
    assert sorted(kept) == ["err part", "half a line", "no newline at the end"]
    assert [line for line in kept if line != "err part"] == ["half a line", "no newline at the end"]


def test_binary_output_reaches_the_container_byte_for_byte_and_is_kept_as_readable_text():
    payload = bytes(range(256)) * 4
    out, _, result = run_training(python(f"""
        import os
        os.write(1, {payload!r})
        os.write(1, b"\\nlast \\xff\\x1b[31mred\\r\\n")
    """))
    assert out == payload + b"\nlast \xff\x1b[31mred\r\n"
    last = result["tail"].splitlines()[-1]
    assert last == "last \ufffd?[31mred"
    assert len(result["tail"].encode()) <= TAIL_BYTES


def test_a_flood_of_output_is_passed_on_whole_and_keeps_the_tail_bounded():
    out, _, result = run_training(python("""
        import sys
        line = "x" * 199 + "\\n"
        sys.stdout.write(line * 50000)
        sys.stdout.write("y" * 100000)  # one line longer than any bound, unfinished
        sys.stdout.flush()
    """), timeout=120)
    assert len(out) == 200 * 50000 + 100000
    tail = result["tail"]
    assert len(tail.encode()) <= TAIL_BYTES
    *before, last = tail.splitlines()
    assert last == "y" * LINE_BYTES  # a line longer than the bound keeps its start
    assert before and all(line == "x" * 199 for line in before)


def test_a_killed_training_keeps_its_exit_code_and_what_it_printed_before():
    def kill(pid: int) -> None:
        import os
        import signal
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)

    out, _, result = run_training(python("""
        import time
        print("before the kill", flush=True)
        time.sleep(60)
    """), on_start=kill)
    assert out == b"before the kill\n"
    assert result["code"] == 137
    assert result["tail"] == "before the kill"


def test_a_command_that_does_not_exist_is_named_in_the_cause():
    _, err, result = run_training(["/nonexistent/torchrun", "train.py"])
    assert result["code"] == 127
    assert result["cause"] == "command not found: /nonexistent/torchrun"
    assert b"trainhook-launch: command not found: /nonexistent/torchrun" in err


def test_the_tail_never_grows_past_its_bounds_whatever_it_is_fed():
    tail = Tail(lines=4, line_bytes=10, tail_bytes=20)
    tail.feed("out", b"a" * 1000)  # an unfinished line is cut at line_bytes
    assert tail.partial["out"][1] == b"a" * 10
    tail.feed("out", b"\n" + b"\n".join(b"%d" % i for i in range(1000)) + b"\n")
    assert [line for _, line in tail.lines["out"]] == [b"996", b"997", b"998", b"999"]
    tail.feed("err", "é".encode() * 30)
    assert len(tail.text().encode()) <= 20
    assert printable(b"\x00tab\there\x7f") == "?tab\there?"


def test_one_streams_end_is_never_pushed_out_by_the_other_read_late():
    tail = Tail(lines=6, line_bytes=100, tail_bytes=1000)
    tail.feed("err", b"Traceback\nValueError: bad batch\n")  # read first, though printed last
    tail.feed("out", b"".join(b"step %d\n" % i for i in range(100)))
    kept = tail.text().splitlines()
    assert len(kept) == 6
    assert kept[:2] == ["Traceback", "ValueError: bad batch"] and kept[2:] == [f"step {i}" for i in range(96, 100)]
    solo = Tail(lines=3, line_bytes=100, tail_bytes=1000)
    solo.feed("out", b"1\n2\n3\n4\n")
    assert solo.text() == "2\n3\n4"  # alone, a stream has the whole budget
