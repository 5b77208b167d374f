"""The webhook's JSON diff against the reference implementation of RFC 6902 (`jsonpatch` applies it): the
patch turns any document into any other, exactly as JSON, and never changes either."""

from __future__ import annotations

import copy

import jsonpatch
from hypothesis import given, settings, strategies as st

from trainhook.webhook.admission.jsondiff import diff, json_copy, pointer_token, same

KEYS = st.sampled_from(["a", "b", "a/b", "~0", "~1/x", "", "env", "0"])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, 1.0, 2.5]),
                   st.sampled_from(["", "x", "1", "true"]))
DOCUMENTS = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(KEYS, inner, max_size=4)), max_leaves=12)


def apply(old, ops):
    return jsonpatch.JsonPatch(copy.deepcopy(ops)).apply(copy.deepcopy(old))


@settings(max_examples=600, deadline=None)
@given(DOCUMENTS, DOCUMENTS)
def test_the_patch_turns_any_document_into_any_other(old, new):
    before_old, before_new = json_copy(old), json_copy(new)
    ops = diff(old, new)
    assert same(apply(old, ops), new)
    assert same(old, before_old) and same(new, before_new)
    assert (ops == []) == same(old, new)


def edited(document, data):
    """A copy of `document` that shares what it did not change, as the pod mutation makes them."""
    if type(document) is dict:
        result = dict(document)
        for key in data.draw(st.lists(st.sampled_from(sorted(document) or ["a"]), max_size=2)):
            choice = data.draw(st.sampled_from(["edit", "drop", "set"]))
            if choice == "edit" and key in result:
                result[key] = edited(result[key], data)
            elif choice == "drop":
                result.pop(key, None)
            else:
                result[key] = data.draw(DOCUMENTS)
        return result
    if type(document) is list:
        front, back = data.draw(st.lists(DOCUMENTS, max_size=2)), data.draw(st.lists(DOCUMENTS, max_size=2))
        items = [edited(item, data) if data.draw(st.booleans()) else item for item in document]
        return front + items + back if data.draw(st.booleans()) else items
    return data.draw(DOCUMENTS) if data.draw(st.booleans()) else document


@settings(max_examples=600, deadline=None)
@given(DOCUMENTS, st.data())
def test_documents_that_share_subtrees_are_diffed_exactly(old, data):
    new = edited(old, data)
    before = json_copy(old)
    assert same(apply(old, diff(old, new)), new)
    assert same(old, before)


def test_numbers_and_booleans_stay_what_they_are():
    for old, new in ((1, 1.0), (1, True), (0, False), ([1], [True]), ({"a": 1}, {"a": 1.0})):
        ops = diff({"v": old}, {"v": new})
        assert ops, (old, new)
        assert same(apply({"v": old}, ops), {"v": new})


def test_front_and_end_insertions_add_items_and_keep_the_rest():
    old = {"env": [{"name": "MINE", "value": "1"}], "volumes": [{"name": "data"}]}
    new = {"env": [{"name": "RANK", "value": "0"}, {"name": "WORLD_SIZE", "value": "2"}, *old["env"]],
           "volumes": [*old["volumes"], {"name": "mpi"}]}
    assert diff(old, new) == [
        {"op": "add", "path": "/env/0", "value": {"name": "RANK", "value": "0"}},
        {"op": "add", "path": "/env/1", "value": {"name": "WORLD_SIZE", "value": "2"}},
        {"op": "add", "path": "/volumes/1", "value": {"name": "mpi"}},
    ]


def test_keys_are_escaped_as_json_pointer_tokens():
    assert pointer_token("trainhook.dev/framework") == "trainhook.dev~1framework"
    assert pointer_token("a~b/c") == "a~0b~1c"
    old = {"metadata": {"labels": {}}}
    ops = diff(old, {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}})
    assert ops == [{"op": "add", "path": "/metadata/labels/kueue.x-k8s.io~1queue-name", "value": "q"}]


def test_a_shared_subtree_is_skipped_without_a_look(monkeypatch):
    """What makes the pod's review cheap: only the copied path is walked, however big the shared rest."""
    from trainhook.webhook.admission import jsondiff
    visited = []
    for name in ("_diff", "same"):
        def counted(a, b, *rest, _original=getattr(jsondiff, name), _name=name):
            visited.append(_name)
            return _original(a, b, *rest)
        monkeypatch.setattr(jsondiff, name, counted)
    shared = {"containers": [{"name": f"c{i}", "env": [{"name": "X", "value": str(i)}]} for i in range(100)]}
    old = {"metadata": {"labels": {"a": "1"}}, "spec": shared}
    new = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": shared}
    assert jsondiff.diff(old, new) == [{"op": "add", "path": "/metadata/labels/b", "value": "2"}]
    assert visited == ["_diff", "_diff", "_diff"]  # the document, metadata, labels: never spec
