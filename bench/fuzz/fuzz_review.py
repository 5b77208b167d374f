"""Coverage-guided fuzzing of the review handler with atheris.

The property: for any bytes, `json.loads` + `review()` either raises BadReview (the server's HTTP 400), or
returns an answer that serializes to JSON and whose patch applies to the object; and reviewing the patched
object again changes nothing more (the webhook is idempotent: a re-admitted object gets an empty patch).
Anything else is a crash.

Byte mutations of JSON mostly make invalid JSON, which `json.loads` refuses before `review()` sees it, so a
structure-aware mutator does most of the work: it parses the input, changes its tree (a node replaced by a
trainhook key, a role, a count, another type; a key added or removed; an item duplicated) and writes it back;
one time in five it mutates the bytes instead, so malformed JSON is still tried.

    python bench/fuzz/fuzz_review.py -runs=3000000 bench/fuzz/corpus     (seeds the corpus when it is empty)
"""

from __future__ import annotations

import base64
import copy
import json
import random
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import jsonpatch

    from trainhook.gang import keys
    from trainhook.webhook.admission.review import BadReview, review
    from trainhook.webhook.settings import Settings

SETTINGS = Settings(gang_key=b"fuzz" * 8)
# Values the tree mutator puts into the documents: every trainhook key and word, and edge values.
TOKENS: list = sorted({v for v in vars(keys).values() if isinstance(v, str)}
                      | {r for roles in keys.ROLES.values() for r in roles}
                      | {"Pod", "StatefulSet", "Job", "Service", "CREATE", "UPDATE", "DELETE", "CONNECT",
                         "worker=2", "master=1,worker=3", "worker=0", "worker=2,worker=2", "chief=1,ps=1,worker=2",
                         "ddp-0", "ddp-x", "ddp", "team-a", "0", "1", "-1", "65535", "65536", "x" * 70, "", " ",
                         "é", "\u0000"})
SCALARS = [0, 1, -1, 2**63, 1.5, True, False, None, [], {}]


def _nodes(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, path + (i,))


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


def mutate_tree(doc, rng: random.Random):
    """One structural change of a JSON document (returns the changed document)."""
    nodes = list(_nodes(doc))
    path, node = rng.choice(nodes)
    action = rng.randrange(6)
    if action == 0:  # replace by a token or a scalar of another type
        return _set(doc, path, rng.choice(TOKENS) if rng.random() < 0.7 else copy.deepcopy(rng.choice(SCALARS)))
    if action == 1 and isinstance(node, dict):  # add a key, trainhook's most of the time
        node[rng.choice(TOKENS)] = rng.choice(TOKENS) if rng.random() < 0.8 else copy.deepcopy(rng.choice(SCALARS))
        return doc
    if action == 2 and isinstance(node, dict) and node:  # drop a key
        del node[rng.choice(list(node))]
        return doc
    if action == 3 and isinstance(node, list) and node:  # duplicate or drop an item
        i = rng.randrange(len(node))
        node.insert(i, copy.deepcopy(node[i])) if rng.random() < 0.5 else node.pop(i)
        return doc
    if action == 4 and isinstance(node, str):  # libFuzzer's own mutation of the string's bytes
        raw = atheris.Mutate(node.encode("utf-8", "surrogatepass"), max(16, 2 * len(node)))
        return _set(doc, path, raw.decode("utf-8", "replace"))
    if action == 5 and path:  # move another subtree here
        other_path, other = rng.choice(nodes)
        if other_path[:len(path)] != path:
            return _set(doc, path, copy.deepcopy(other))
    return _set(doc, path, rng.choice(TOKENS))


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return atheris.Mutate(data, max_size)
    if rng.random() < 0.2:
        return atheris.Mutate(data, max_size)
    for _ in range(rng.randint(1, 3)):
        doc = mutate_tree(doc, rng)
    out = json.dumps(doc).encode()
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def patched(body: dict, answer: dict) -> dict:
    """The object as the API server stores it after this answer."""
    response = answer["response"]
    obj = body["request"]["object"]
    if "patch" not in response:
        return obj
    patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"])))
    return patch.apply(obj)


def one_input(data: bytes) -> None:
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return
    original = copy.deepcopy(body)
    try:
        answer = review(body, SETTINGS).answer
    except BadReview:
        return
    if body != original:
        raise AssertionError("review() changed the object it was given")
    json.dumps(answer)
    if not answer["response"].get("allowed") or body["request"]["operation"] not in ("CREATE", "UPDATE"):
        return
    stored = patched(body, answer)
    again = copy.deepcopy(body)
    again["request"]["object"] = stored
    second = review(again, SETTINGS).answer["response"]
    if "patch" in second or not second.get("allowed"):
        raise AssertionError(f"reviewing the mutated object again is not a no-op: {second}")


def seed_corpus(directory: Path) -> None:
    """Seeds: reviews of the objects users write and of the pods the controllers make of the mutated
    workloads (from the tests' builders)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from objects import bare_pod, indexed_job, pod_of_job, pod_of_statefulset, service, statefulset
    from objects import review as make_review

    from trainhook.webhook.admission.mutate import mutate

    def admitted(obj: dict) -> dict:
        return mutate(obj["kind"], "CREATE", obj, "team-a", SETTINGS).obj

    sts, job = statefulset("ddp", 4), indexed_job("ij", 2)
    tf = statefulset("tf-worker", 2, labels={keys.FRAMEWORK: "tensorflow", keys.JOB_NAME: "tf", keys.ROLE: "worker"},
                     annotations={keys.REPLICAS: "chief=1,worker=2"}, service="tf")
    seeds = [sts, job, tf, service("ddp", clusterIP="None"), pod_of_statefulset(admitted(sts), 1),
             pod_of_job(admitted(job), 1), pod_of_statefulset(admitted(tf), 0),
             bare_pod("solo-0", {keys.JOB_NAME: "solo", keys.INDEX: "0"}, {keys.REPLICAS: "worker=2",
                                                                           keys.GANG_SCHEDULER: "volcano"})]
    directory.mkdir(parents=True, exist_ok=True)
    for n, obj in enumerate(seeds):
        (directory / f"seed-{n}.json").write_text(json.dumps(make_review(obj)))


if __name__ == "__main__":
    corpus = Path(__file__).resolve().parent / "corpus"
    if not corpus.exists() or not any(corpus.iterdir()):
        seed_corpus(corpus)
    atheris.Setup(sys.argv, one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
