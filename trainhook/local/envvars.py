"""A container's environment and command line, as the kubelet computes them.

`expand` is a port of Kubernetes' third_party/forked/golang/expansion: `$(VAR)` expands to a variable defined
earlier in the container's list, an unknown reference stays literal, `$$` is an escaped `$`. `envFrom` comes
first, then `env` in order; `command` and `args` are expanded with the final environment.
"""

from __future__ import annotations

import base64
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainhook.local.manifest import describe

NODE_NAME = "local"
_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")
SUPPORTED_FIELDS = ("metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels['KEY']",
                    "metadata.annotations['KEY']", "spec.nodeName", "spec.serviceAccountName", "status.podIP",
                    "status.podIPs")


class EnvError(Exception):
    """An environment the kubelet would refuse to build (CreateContainerConfigError); names the variable."""


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """Kubernetes' expansion.Expand: replace `$(NAME)` with mapping(NAME); `$$` becomes `$`."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":  # escaped operator
                out.append("$")
                advance = 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:  # incomplete reference: keep it as written
                    out.append("$(")
                    advance = 1
                else:
                    out.append(mapping(rest[1:close]))
                    advance = close + 1
            else:  # a `$` that starts no expression, kept with the next character
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


def mapping_for(*contexts: Mapping[str, str]) -> Callable[[str], str]:
    """expansion.MappingFuncFor: the first context that defines NAME wins; unknown names stay `$(NAME)`."""
    def lookup(name: str) -> str:
        for context in contexts:
            if name in context:
                return context[name]
        return f"$({name})"
    return lookup


@dataclass(frozen=True)
class PodFacts:
    """What a fieldRef can read that is not in the pod object itself: the runtime's answers."""

    pod_ip: str
    node_name: str = NODE_NAME


def field_value(pod: dict, path: str, facts: PodFacts) -> str:
    """The value of a `valueFrom.fieldRef.fieldPath` (the downward API)."""
    meta = pod.get("metadata") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": facts.node_name,
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", "default"),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
    }
    if path in simple:
        return str(simple[path])
    match = _FIELD_LABEL.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise EnvError(f"fieldRef {path!r} is not supported locally; supported: {', '.join(SUPPORTED_FIELDS)}")


def source_bytes(kind: str, obj: dict) -> dict[str, bytes]:
    """A ConfigMap's data and binaryData, or a Secret's data and stringData, as bytes by key."""
    if kind == "Secret":
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        data.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
        return data
    data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


class Sources:
    """The ConfigMaps and Secrets of the manifest, by (namespace, name), for env and volumes."""

    def __init__(self, configmaps: Mapping[tuple[str, str], dict], secrets: Mapping[tuple[str, str], dict]):
        self.configmaps = configmaps
        self.secrets = secrets

    def data(self, kind: str, namespace: str, name: str, optional: bool) -> dict[str, str] | None:
        """The object's data, None when it is missing and optional; EnvError when missing and required."""
        table = self.secrets if kind == "Secret" else self.configmaps
        obj = table.get((namespace, name))
        if obj is None:
            if optional:
                return None
            raise EnvError(f'{kind.lower()} "{name}" not found in namespace {namespace!r} (add it to the manifest)')
        return {k: v.decode(errors="replace") for k, v in source_bytes(kind, obj).items()}


def _value_from(ref: dict, pod: dict, facts: PodFacts, sources: Sources, name: str) -> str | None:
    namespace = pod["metadata"]["namespace"]
    if "fieldRef" in ref:
        return field_value(pod, ref["fieldRef"].get("fieldPath", ""), facts)
    for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        if key in ref:
            sel = ref[key]
            data = sources.data(kind, namespace, sel.get("name", ""), bool(sel.get("optional")))
            if data is None:
                return None
            if sel.get("key") not in data:
                if sel.get("optional"):
                    return None
                raise EnvError(f"{name}: key {sel.get('key')!r} not found in {kind.lower()} {sel.get('name')!r}")
            return data[sel["key"]]
    raise EnvError(f"{name}: valueFrom {sorted(ref)} is not supported locally "
                   "(fieldRef, configMapKeyRef and secretKeyRef are)")


def container_env(container: dict, pod: dict, facts: PodFacts, sources: Sources) -> dict[str, str]:
    """The variables the kubelet gives a container from its spec (envFrom, then env, in order)."""
    env: dict[str, str] = {}
    namespace = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if key in source:
                ref = source[key]
                data = sources.data(kind, namespace, ref.get("name", ""), bool(ref.get("optional")))
                for var, value in (data or {}).items():
                    env[source.get("prefix", "") + var] = value
    for item in container.get("env") or []:
        name = item.get("name")
        if not name:
            raise EnvError(f"container {container.get('name')!r}: an env entry has no name")
        if "valueFrom" in item:
            found = _value_from(item["valueFrom"], pod, facts, sources, name)
            if found is None:  # an optional reference to something missing: the variable is left out
                continue
            env[name] = found
        else:
            env[name] = expand(str(item.get("value", "")), mapping_for(env))
    return env


def command_line(container: dict, env: Mapping[str, str], owner: dict) -> list[str]:
    """`command` + `args` with `$(VAR)` expanded. The image's entrypoint is unknown locally, so `command` is
    required (in a cluster, `args` alone would run after the image's ENTRYPOINT)."""
    command = container.get("command") or []
    if not command:
        raise EnvError(f"{describe(owner)}: container {container.get('name')!r} has no `command`: the image is not "
                       "run locally, so its entrypoint is unknown; write the full command in the manifest")
    lookup = mapping_for(env)
    return [expand(str(part), lookup) for part in list(command) + list(container.get("args") or [])]


def base_env(hostname: str, environ: Mapping[str, str] | None = None, image_bin: str | None = None) -> dict[str, str]:
    """What a container gets from outside its spec: PATH, HOME, LANG, HOSTNAME. Locally the image's own
    environment is stood in for by the current Python environment: PATH starts with `image_bin` (a user's image:
    its Python and framework commands, nothing of trainhook's; trainhook.local.images), else with this
    interpreter's directory (the launcher image)."""
    environ = os.environ if environ is None else environ
    own_bin = os.path.dirname(sys.executable)
    parts = [image_bin or own_bin] + [p for p in environ.get("PATH", os.defpath).split(os.pathsep)
                                      if p and p != own_bin]
    env = {"PATH": os.pathsep.join(parts), "HOME": environ.get("HOME", "/root"), "HOSTNAME": hostname}
    if "LANG" in environ:
        env["LANG"] = environ["LANG"]
    return env
