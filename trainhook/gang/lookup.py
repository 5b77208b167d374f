"""THE lookup of a trainhook setting (a label or an annotation) across a workload and its pod template.

A user may write a trainhook label or annotation on the workload's own metadata or on its pod template. The one
precedence (docs/use/contract.md section 2): **the pod template's value, then the workload's** — the template is all
a pod ever sees, and the webhook stamps the workload's annotations onto it (never over the template's own). An
empty value counts as unset. Where both places set different values, `Found.conflict` says so: admission refuses
it with `Found.refusal` (as it does for the identity labels), and readers that cannot refuse (`trainhook status`,
the scale check) take the template's.

`trainhook.dev/replicas` on a template is the webhook's own stamp of the shape (derived from the workload), so the
workload's admission reads both places through `lookup` but applies its own rule to them
(webhook/admission/workloads.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

LABELS, ANNOTATIONS = "labels", "annotations"


@dataclass(frozen=True)
class Found:
    """A setting as written on a workload (`workload`) and on its pod template (`template`); None where unset."""

    key: str
    field: str  # LABELS or ANNOTATIONS
    workload: Optional[str]
    template: Optional[str]

    @property
    def value(self) -> Optional[str]:
        """The answer: the template's value, else the workload's (None when neither sets it)."""
        return self.template if self.template is not None else self.workload

    @property
    def conflict(self) -> bool:
        return self.workload is not None and self.template is not None and self.workload != self.template

    def refusal(self, kind: str) -> tuple[str, str]:
        """(why, fix) for a conflict, as admission words it: `kind` is the workload's (StatefulSet, Job)."""
        what = "label" if self.field == LABELS else "annotation"
        return (f"the {kind}'s {what} says {self.workload!r} but its pod template's says {self.template!r}",
                f"make the two agree, or write the {what} in one place only")


def _mapping(meta: object, field: str) -> dict:
    found = meta.get(field) if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def template_metadata(obj: dict) -> dict:
    """The metadata of the workload's pod template ({} when it has none, or a malformed template)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    template = spec.get("template") if isinstance(spec, dict) else None
    meta = template.get("metadata") if isinstance(template, dict) else None
    return meta if isinstance(meta, dict) else {}


def _value(mapping: dict, key: str) -> Optional[str]:
    value = mapping.get(key)
    return None if value is None or value == "" else str(value)


def lookup(obj: dict, key: str, field: str = ANNOTATIONS) -> Found:
    """`key` in the workload's own `field` (labels or annotations) and in its pod template's."""
    own = _mapping(obj.get("metadata") if isinstance(obj, dict) else None, field)
    return Found(key, field, _value(own, key), _value(_mapping(template_metadata(obj), field), key))


def setting(obj: dict, key: str, field: str = ANNOTATIONS) -> Optional[str]:
    """The value of `key` under the one precedence (template, then workload), for readers that cannot refuse."""
    return lookup(obj, key, field).value
