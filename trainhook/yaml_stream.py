"""Reading a YAML stream of Kubernetes objects, with errors that point at the line: shared by `trainhook local`
(manifests) and `trainhook convert` (Kubeflow jobs), so both report a broken file the same way."""

from __future__ import annotations

import yaml


def yaml_documents(text: str, path: str, error: type[Exception]) -> list[object]:
    """Every document of the stream; invalid YAML raises `error` with `path:line:column` and the parser's words."""
    try:
        return list(yaml.safe_load_all(text))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = " ".join(part for part in (e.context, e.problem) if part)
        raise error(f"{where}: invalid YAML: {problem}") from e
    except yaml.YAMLError as e:
        raise error(f"{path}: invalid YAML: {e}") from e
