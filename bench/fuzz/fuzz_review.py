"""Coverage-guided fuzzing of the review handler with atheris.

The property: for any bytes, `json.loads` + `review()` either raises BadReview (the server's HTTP 400), or
returns an answer that serializes to JSON and whose patch applies to the object. Anything else is a crash.

    python bench/fuzz/fuzz_review.py -runs=200000 bench/fuzz/corpus
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import jsonpatch

    from trainhook.webhook.review import BadReview, review
    from trainhook.webhook.settings import Settings

SETTINGS = Settings()


def one_input(data: bytes) -> None:
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return
    try:
        answer = review(body, SETTINGS).answer
    except BadReview:
        return
    json.dumps(answer)
    response = answer["response"]
    if "patch" in response:
        patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"])))
        patch.apply(body["request"]["object"])


def seed_corpus(directory: Path) -> None:
    """Seeds: real reviews of the examples' objects and pods (from the tests' builders)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from objects import indexed_job, pod_of_job, pod_of_statefulset, review as make_review, service, statefulset

    directory.mkdir(parents=True, exist_ok=True)
    sts = statefulset("ddp", 4)
    seeds = [sts, service("ddp"), indexed_job("ij", 2), pod_of_job(indexed_job("ij", 2), 1),
             pod_of_statefulset(review(make_review(sts), SETTINGS) and sts, 1)]
    for n, obj in enumerate(seeds):
        (directory / f"seed-{n}.json").write_text(json.dumps(make_review(obj)))


if __name__ == "__main__":
    corpus = Path(__file__).resolve().parent / "corpus"
    if not corpus.exists():
        seed_corpus(corpus)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
