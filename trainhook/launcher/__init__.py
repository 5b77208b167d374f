"""The in-pod launcher (`trainhook-launch`).

Its start is CPU in every gang pod (issue 32), so the modules it imports (the ones launcher/deliver.py ships with
bytecode, trainhook/gang/ among them) import no `typing` at run time: each says `TYPE_CHECKING = False` (a
constant mypy reads as typing's own) and imports typing's names under `if TYPE_CHECKING:`, for annotations only
(`from __future__ import annotations` keeps them unevaluated). Importing typing was ~4 ms of a start's CPU
(docs/develop/performance.md).
"""
