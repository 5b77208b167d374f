"""Ship a Python function in a pod's command, as Kubeflow's training SDK does (`create_job(train_func=...)`).

The function's source (`inspect.getsource`, dedented) is written to a file by a bash heredoc in the container's
command, followed by a call with the arguments (a JSON object, passed as one dict, as Kubeflow's v1 SDK passes
`parameters`, or as keyword arguments, as Trainer v2's passes `func_args`), then run with `torchrun` for PyTorch
(which reads its arguments from the PET_* variables the webhook injects) or `python` for the other frameworks. The
heredoc's delimiter is quoted, so nothing in the source is expanded by the shell. Packages are pip-installed first.
The function must be self-contained: it runs in a fresh interpreter, so its imports belong inside it. An image
without the runner (`torchrun`, `python`) fails with exit 127 and `command not found: torchrun`, which the launcher
puts in the gang's outcome.
"""

from __future__ import annotations

import inspect
import json
import shlex
import textwrap
from collections.abc import Callable

from trainhook.gang import keys

DELIMITER = "TRAINHOOK_FUNCTION_EOF"
SCRIPT_NAME = "ephemeral_script.py"
# What runs the script, per framework: torchrun takes --nnodes, --node-rank, ... from the PET_* variables.
ENTRYPOINT = {keys.PYTORCH: ["torchrun"]}
DEFAULT_ENTRYPOINT = ["python"]


def function_script(func: Callable, func_args: dict | None = None, unpack: bool = False) -> str:
    """The Python program: the function's source, then the call: the arguments as one dict (Kubeflow v1's
    `parameters`), or with `unpack` as keyword arguments (Trainer v2's `func(**func_args)`)."""
    if not callable(func) or getattr(func, "__name__", "<lambda>") == "<lambda>":
        raise ValueError("func must be a function defined with def (its source is shipped to the pods)")
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise ValueError(f"cannot read the source of {func.__name__}: {e}") from e
    if func_args is None:
        call = f"{func.__name__}()"
    else:
        if not isinstance(func_args, dict):
            raise ValueError("func_args must be a dict (passed to the function as one argument, as Kubeflow does)")
        try:
            encoded = json.dumps(func_args)
        except (TypeError, ValueError) as e:
            raise ValueError(f"func_args must be JSON (it is written into the pods' command): {e}") from e
        call = f"{func.__name__}({'**' if unpack else ''}json.loads({encoded!r}))"
    return f"import json\n\n{source.rstrip()}\n\n\nif __name__ == \"__main__\":\n    {call}\n"


def pip_command(packages: list[str], index_url: str | None = None, extra_index_urls: list[str] | None = None) -> str:
    """pip's command line; `extra_index_urls` are Trainer v2's pip_index_urls after the first."""
    index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    index += "".join(f"--extra-index-url {shlex.quote(url)} " for url in extra_index_urls or [])
    names = " ".join(shlex.quote(p) for p in packages)
    return (f"PIP_DISABLE_PIP_VERSION_CHECK=1 python -m pip install --quiet --no-warn-script-location "
            f"{index}{names}")


def function_command(func: Callable, func_args: dict | None = None, framework: str = keys.PYTORCH,
                     packages_to_install: list[str] | None = None, pip_index_url: str | None = None, *,
                     extra_index_urls: list[str] | None = None, unpack: bool = False) -> list[str]:
    """The container command: `bash -c` writing the function to a file and running it."""
    script = function_script(func, func_args, unpack)
    if any(line.strip() == DELIMITER for line in script.splitlines()):
        raise ValueError(f"the function's source contains the line {DELIMITER}")
    entrypoint = " ".join(ENTRYPOINT.get(framework, DEFAULT_ENTRYPOINT))
    lines = ["set -e"]
    if packages_to_install:
        lines.append(pip_command(packages_to_install, pip_index_url, extra_index_urls))
    runner = ENTRYPOINT.get(framework, DEFAULT_ENTRYPOINT)[0]
    lines += [
        'program_path="$(mktemp -d)"',
        f"cat > \"$program_path/{SCRIPT_NAME}\" <<'{DELIMITER}'",
        script.rstrip("\n"),
        DELIMITER,
        # An image without the runner fails naming it (exit 127, as a shell's), and the launcher carries that line
        # into the gang's outcome: "exited with 127 (command not found: torchrun)".
        f"command -v {runner} >/dev/null 2>&1 || {{ echo \"command not found: {runner} (the image has no "
        f"{runner} on its PATH: give base_image= an image that has it)\" >&2; exit 127; }}",
        f'exec {entrypoint} "$program_path/{SCRIPT_NAME}"',
    ]
    return ["bash", "-c", "\n".join(lines) + "\n"]
