"""The JSON patch (RFC 6902) that turns one JSON document into another, computed by comparing the two.

Why not `jsonpatch.JsonPatch.from_diff`: it walks and compares every leaf of both documents, which was a
quarter of a review's cost. Here a subtree the new document *shares* with the old one (the same Python
object) is skipped without a look; the pod mutation copies only the objects it writes to (`pods.writable`),
so the walk touches the pod's top levels and its changed containers, nothing else. Where the documents do
not share, the comparison is still exact: 1, 1.0 and true stay different, as they are in JSON.

The patch is correct for any two documents, not always minimal: a list changes by items added at its front
or its end (what a mutation does: injected variables go first, volumes last), item by item when its length
is kept, and else it is replaced whole.
"""

from __future__ import annotations

from typing import Any


def same(a: Any, b: Any) -> bool:
    """Equal as JSON: same types all the way down (Python's == says 1 == 1.0 == True)."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        return a.keys() == b.keys() and all(same(value, b[key]) for key, value in a.items())
    if kind is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON document (dicts, lists and immutable leaves); copy.deepcopy's memo and dispatch
    make it several times slower for these."""
    kind = type(value)
    if kind is dict:
        return {key: json_copy(item) for key, item in value.items()}
    if kind is list:
        return [json_copy(item) for item in value]
    return value


def pointer_token(key: str) -> str:
    """A key as one JSON-pointer token (RFC 6901): `~` is `~0`, `/` is `~1`."""
    if "~" in key or "/" in key:
        return key.replace("~", "~0").replace("/", "~1")
    return key


def diff(old: Any, new: Any) -> list[dict]:
    """The operations that turn `old` into `new`; an empty list when they are equal as JSON."""
    ops: list[dict] = []
    _diff(old, new, "", ops)
    return ops


def _diff(old: Any, new: Any, path: str, ops: list[dict]) -> None:
    if old is new:
        return
    kind = type(old)
    if kind is dict and type(new) is dict:
        for key, value in old.items():
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{pointer_token(key)}"})
            elif new[key] is not value:  # checked here, not in the call: most keys are shared
                _diff(value, new[key], f"{path}/{pointer_token(key)}", ops)
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{pointer_token(key)}", "value": value})
    elif kind is list and type(new) is list:
        _diff_list(old, new, path, ops)
    elif not same(old, new):
        ops.append({"op": "replace", "path": path, "value": new})


def _diff_list(old: list, new: list, path: str, ops: list[dict]) -> None:
    added = len(new) - len(old)
    if added == 0:
        for index, (x, y) in enumerate(zip(old, new)):
            if x is not y:
                _diff(x, y, f"{path}/{index}", ops)
    elif added > 0 and all(same(x, y) for x, y in zip(old, new[added:])):
        ops.extend({"op": "add", "path": f"{path}/{index}", "value": new[index]} for index in range(added))
    elif added > 0 and all(same(x, y) for x, y in zip(old, new)):
        ops.extend({"op": "add", "path": f"{path}/{index}", "value": new[index]}
                   for index in range(len(old), len(new)))
    else:
        ops.append({"op": "replace", "path": path, "value": new})
