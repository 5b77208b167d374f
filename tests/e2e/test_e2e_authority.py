"""The gang holds no keys to the cluster (issue 22, docs/operate/security.md), shown on the node with a default
`helm install` and a fresh namespace named nowhere in the chart's values:

- a StatefulSet gang of the user's image (nothing of trainhook in it) trains once; the notary records Succeeded on
  the StatefulSet (annotations and the `trainhook.dev/phase` label, so plain `kubectl get -l` filters it), scales
  it to zero, and `kubectl describe statefulset` shows the Event;
- a gang whose rank 1 exits 3 records Failed naming rank 1, its pod and code 3, stops whole, and emits a Warning;
- the namespace's ServiceAccount may do none of what the gang's authority needs: `kubectl auth can-i --as` and the
  training pod's own token (a SelfSubjectAccessReview from inside rank 0) both answer no, printed as a matrix;
- forgery: a pod carrying the running gang's labels and holding everything readable from the gang's pod specs
  plus its own projected token of audience `trainhook` asks the notary for the gang's key and to record success,
  and speaks the launchers' protocol to the coordinator: all refused, and the gang finishes with its own outcome.
"""

from __future__ import annotations

import json
import re

from e2e_gangs import pods_of, statefulset, statefulset_gang
from e2e_helpers import RELEASE_NAMESPACE, LogFollower, shown_on_failure, wait_for

# What the gang's authority needs, and what no training ServiceAccount may do (issue 22's matrix).
MATRIX = [("create", "pods", "exec"), ("get", "pods", "exec"), ("patch", "statefulsets", ""),
          ("update", "statefulsets", ""), ("patch", "statefulsets", "scale"), ("list", "pods", ""),
          ("patch", "jobs", ""), ("get", "secrets", "")]

RANK_SCRIPT = """
import json, os, ssl, sys, time, urllib.request
rank = int(os.environ["RANK"])
print(f"rank {rank}: training started", flush=True)
if rank == 0:
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    token = open(sa + "/token").read().strip()
    namespace = open(sa + "/namespace").read().strip()
    context = ssl.create_default_context(cafile=sa + "/ca.crt")
    url = "https://%s:%s/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" % (
        os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
    for verb, resource, sub in MATRIX:
        attributes = {"namespace": namespace, "verb": verb, "resource": resource,
                      "group": "apps" if resource == "statefulsets" else "batch" if resource == "jobs" else ""}
        if sub:
            attributes["subresource"] = sub
        body = json.dumps({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                           "spec": {"resourceAttributes": attributes}}).encode()
        request = urllib.request.Request(url, body, {"Authorization": "Bearer " + token,
                                                     "Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, context=context, timeout=10))
        allowed = answer["status"].get("allowed", False)
        print("CAN-I %s %s%s: %s" % (verb, resource, "/" + sub if sub else "", "yes" if allowed else "no"),
              flush=True)
time.sleep(SLEEP)
if rank == FAIL_RANK:
    print(f"rank {rank}: failing", flush=True)
    sys.exit(3)
if FAIL_RANK >= 0:
    time.sleep(300)  # the others train on: rank 1's failure ends the gang, and they are stopped
print(f"rank {rank}: done", flush=True)
"""

FORGE_SCRIPT = r"""
import json, os, secrets, socket, ssl, sys, urllib.error, urllib.request
token = open("/var/run/secrets/forged/token").read().strip()
notary, ca = os.environ["GANG_NOTARY"], os.environ["GANG_NOTARY_CA"]
context = ssl.create_default_context(cadata=ca)
results = []

def call(method, path, body):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(notary + path, data, {"Authorization": "Bearer " + token,
                                                           "Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, answer.read().decode()[:300]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:300]

for attempt in range(3):  # asked again: the notary logs a refusal once per (pod, reason), not once per call
    status, text = call("POST", "/v1/credential", {})
    results.append(("credential", status, text))
forged = {"phase": "Failed", "code": 3, "reason": "rank 1 exited with 3 (forged)", "rank": 1,
          "time": "2026-01-01T00:00:00Z"}
status, text = call("POST", "/v1/outcome", {"outcome": forged})
results.append(("record a forged outcome", status, text))

# The launchers' own protocol, with all a pod spec shows (namespace, job, rank) and a key of our own.
try:
    sock = socket.create_connection((os.environ["GANG_COORDINATOR"], 29497), timeout=10)
    sock.sendall((json.dumps({"protocol": "trainhook-gang-run/1", "namespace": os.environ["GANG_NAMESPACE"],
                              "job": os.environ["GANG_JOB"], "rank": 1, "nonce": secrets.token_hex(16)}) + "\n").encode())
    answer = sock.recv(65536).decode()
    sock.sendall((json.dumps({"seq": 0, "body": {"type": "exited", "code": 3}, "mac": secrets.token_hex(32)}) + "\n").encode())
    more = sock.recv(65536).decode()
    results.append(("join the coordinator", 0 if more == "" or "error" in (answer + more) else 200, answer + more))
except OSError as e:
    results.append(("join the coordinator", 0, str(e)))
ok = True
for what, status, text in results:
    refused = status in (0, 401, 403)
    ok = ok and refused
    print("%s %s: %s %s" % ("REFUSED" if refused else "ACCEPTED", what, status, text.strip()[:200]), flush=True)
sys.exit(0 if ok else 1)
"""


def rank_script(sleep: float, fail_rank: int | None = None) -> str:
    return (RANK_SCRIPT.replace("MATRIX", repr(MATRIX)).replace("SLEEP", str(sleep))
            .replace("FAIL_RANK", str(-1 if fail_rank is None else fail_rank)))


def events_of(node, namespace: str, name: str) -> list[dict]:
    events = json.loads(node.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    return [e for e in events if e["involvedObject"].get("name") == name
            and e["involvedObject"].get("kind") == "StatefulSet"]


def names_with_label(node, namespace: str, selector: str) -> list[str]:
    out = node.kubectl("get", "statefulsets", "-n", namespace, "-l", selector, "-o", "name")
    return [line.split("/", 1)[1] for line in out.split()]


def run_gang(node, namespace: str, name: str, replicas: int, script: str, phase: str) -> tuple[dict, dict]:
    """Apply the gang, follow its pods' logs, wait for the recorded `phase` and the scale to zero; (the
    StatefulSet's annotations, the logs by pod)."""
    followers = {f"{name}-{i}": None for i in range(replicas)}
    node.apply(namespace, statefulset_gang(name, node.images["torch"], ["python", "-c", script], replicas))
    for pod in followers:
        followers[pod] = LogFollower(node, namespace, pod, "trainer")
    try:
        def recorded():
            annotations = statefulset(node, name, namespace)["metadata"].get("annotations") or {}
            got = annotations.get("trainhook.dev/phase")
            assert got in (None, phase), annotations
            return got == phase and annotations
        with shown_on_failure(node, namespace, followers):
            annotations = wait_for(recorded, 120, f"{name} to record {phase}", interval=1)
            wait_for(lambda: statefulset(node, name, namespace)["spec"]["replicas"] == 0, 30,
                     f"{name} scaled to 0")
            wait_for(lambda: not pods_of(node, name, namespace), 60, f"the pods of {name} to be deleted")
        return annotations, {pod: f.text for pod, f in followers.items()}
    finally:
        for follower in followers.values():
            follower.stop()


def test_a_gang_in_an_unlisted_namespace_records_succeeded_stops_and_emits_an_event(node, release, namespace):
    name = "once"
    annotations, logs = run_gang(node, namespace, name, 3, rank_script(2), "Succeeded")
    assert annotations["trainhook.dev/exit-code"] == "0", annotations
    for pod, text in logs.items():  # trained exactly once
        rank = pod.rsplit("-", 1)[1]
        assert text.count(f"rank {rank}: training started") == 1, (pod, text[-2000:])
        assert text.count(f"rank {rank}: done") == 1, (pod, text[-2000:])
    # The phase is a label too: plain kubectl filters and shows it.
    assert names_with_label(node, namespace, "trainhook.dev/phase=Succeeded") == [name]
    assert names_with_label(node, namespace, "trainhook.dev/phase=Failed") == []
    columns = node.kubectl("get", "sts", name, "-n", namespace, "-L", "trainhook.dev/phase")
    assert "Succeeded" in columns, columns
    events = events_of(node, namespace, name)
    assert any(e["type"] == "Normal" and "Succeeded" in e["reason"] for e in events), events
    described = node.kubectl("describe", "statefulset", name, "-n", namespace)
    assert re.search(r"Normal\s+GangSucceeded", described), described

    # The permission matrix, from the training pod's own token (rank 0 asked the API server itself).
    matrix = dict(re.findall(r"CAN-I (\S+ \S+): (yes|no)", logs[f"{name}-0"]))
    print("rank 0's own ServiceAccount token:")
    for verb, resource, sub in MATRIX:
        key = f"{verb} {resource}{'/' + sub if sub else ''}"
        print(f"  can-i {key:28} {matrix.get(key)}")
    assert len(matrix) == len(MATRIX) and set(matrix.values()) == {"no"}, matrix


def test_the_namespace_default_serviceaccount_can_do_none_of_it(node, release, namespace):
    rows = []
    for account in (f"system:serviceaccount:{namespace}:default", f"system:serviceaccount:{namespace}:trainer"):
        for verb, resource, sub in MATRIX:
            target = f"{resource}/{sub}" if sub else resource
            answer = node.kubectl("auth", "can-i", f"--as={account}", verb, target, "-n", namespace,
                                  check=False).strip()
            rows.append((account, f"{verb} {target}", answer))
    print("\n".join(f"{a:52} {what:28} {answer}" for a, what, answer in rows))
    assert {answer for _, _, answer in rows} == {"no"}, rows
    # The chart binds nothing to whole groups of ServiceAccounts.
    bindings = json.loads(node.kubectl("get", "rolebindings,clusterrolebindings", "-A", "-o", "json"))["items"]
    grouped = [b["metadata"]["name"] for b in bindings for s in b.get("subjects") or []
               if s.get("kind") == "Group" and s.get("name", "").startswith("system:serviceaccounts")
               and "trainhook" in b["metadata"]["name"]]
    assert grouped == [], grouped


def test_a_failing_rank_is_recorded_by_rank_pod_and_code_with_a_warning(node, release, namespace):
    name = "fails"
    annotations, logs = run_gang(node, namespace, name, 3, rank_script(3, fail_rank=1), "Failed")
    assert annotations["trainhook.dev/exit-code"] == "3", annotations
    reason = annotations["trainhook.dev/phase-reason"]
    assert re.search(r"\brank 1\b", reason) and f"{name}-1" in reason and "3" in reason, reason
    assert names_with_label(node, namespace, "trainhook.dev/phase=Failed") == [name]
    events = events_of(node, namespace, name)
    # Only trainhook's own Event: the StatefulSet controller may add FailedCreate warnings of its own when the
    # API server is slow to admit a pod, and retries them.
    warnings = [e for e in events if e["type"] == "Warning" and e["reason"] == "GangFailed"
                and e["source"].get("component") == "trainhook-notary"]
    assert len(warnings) == 1 and f"{name}-1" in warnings[0]["message"] and "3" in warnings[0]["message"], events
    for pod, text in logs.items():
        assert text.count("training started") == 1, (pod, text[-2000:])


def test_a_labeled_pod_and_a_pod_spec_reader_cannot_join_stop_or_fake_a_gang(node, release, namespace):
    name = "guarded"
    gang = statefulset_gang(name, node.images["torch"], ["python", "-c", rank_script(25)], 2)
    node.apply(namespace, gang)
    followers = {f"{name}-{i}": LogFollower(node, namespace, f"{name}-{i}", "trainer") for i in range(2)}
    try:
        with shown_on_failure(node, namespace, followers):
            wait_for(lambda: all("training started" in f.text for f in followers.values()), 120,
                     "both ranks to start training")
            # Everything a pod-spec reader sees of the gang (the `view` role): rank 0's spec.
            spec = node.pod(namespace, f"{name}-0")
            trainer = next(c for c in spec["spec"]["containers"] if c["name"] == "trainer")
            env = {e["name"]: e.get("value", "") for e in trainer.get("env", [])}
            assert "TRAINHOOK_GANG_TOKEN" not in env and not any("KEY" in k for k in env), sorted(env)
            forger = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-intruder", "labels": {
                    **spec["metadata"]["labels"], "trainhook.dev/index": "1"},
                    # No launcher and no gang wait: the attacker runs its own code at once.
                    "annotations": {"trainhook.dev/launcher": "none", "trainhook.dev/gang-wait": "none",
                                    "trainhook.dev/replicas": spec["metadata"]["annotations"]["trainhook.dev/replicas"]}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "forge", "image": node.images["torch"], "imagePullPolicy": "Never",
                    "command": ["python", "-c", FORGE_SCRIPT],
                    "env": [{"name": "GANG_NOTARY", "value": env["TRAINHOOK_NOTARY"]},
                            {"name": "GANG_NOTARY_CA", "value": env["TRAINHOOK_NOTARY_CA"]},
                            {"name": "GANG_COORDINATOR", "value": f"{name}-0.{name}"},
                            {"name": "GANG_NAMESPACE", "value": namespace}, {"name": "GANG_JOB", "value": name}],
                    "volumeMounts": [{"name": "forged", "mountPath": "/var/run/secrets/forged"}]}],
                    # Any pod may ask its kubelet for a token of its own ServiceAccount with any audience.
                    "volumes": [{"name": "forged", "projected": {"sources": [{"serviceAccountToken": {
                        "audience": "trainhook", "expirationSeconds": 3600, "path": "token"}}]}}]}}
            forger["metadata"]["labels"].pop("app", None)  # not one of the StatefulSet's own pods
            node.apply(namespace, [forger])
            from e2e_helpers import wait_pod_phase
            wait_pod_phase(node, namespace, f"{name}-intruder", {"Succeeded", "Failed"}, 120)
            forged_log = node.logs(namespace, f"{name}-intruder")
            print(forged_log)
            assert "ACCEPTED" not in forged_log and forged_log.count("REFUSED") == 5, forged_log

            def recorded():
                annotations = statefulset(node, name, namespace)["metadata"].get("annotations") or {}
                return annotations.get("trainhook.dev/phase") and annotations
            annotations = wait_for(recorded, 120, "the gang's own outcome", interval=1)
        assert annotations["trainhook.dev/phase"] == "Succeeded", annotations
        assert "forged" not in annotations.get("trainhook.dev/phase-reason", ""), annotations
        for pod, follower in followers.items():
            assert follower.text.count(f"rank {pod.rsplit('-', 1)[1]}: done") == 1, (pod, follower.text[-2000:])
        # The notary logged the refused credential once, however often it was asked.
        webhook_logs = "".join(node.logs(RELEASE_NAMESPACE, p["metadata"]["name"]) for p in json.loads(
            node.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"])
        refusals = [line for line in webhook_logs.splitlines() if f"{name}-intruder" in line]
        print("\n".join(refusals))
        assert 1 <= len(refusals) <= 2, refusals  # the credential once, the forged record once
    finally:
        for follower in followers.values():
            follower.stop()
        node.kubectl("delete", "pod", f"{name}-intruder", "-n", namespace, "--wait=false", check=False)
