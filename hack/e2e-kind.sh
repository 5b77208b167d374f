#!/usr/bin/env bash
# make e2e-kind: the chart and the PyTorch example on a real cluster (kind), for machines with Docker.
# NOT run by CI (no container engine there); every step below is covered by tests that do run (docs/operate/certificates.md).
# Needs docker, kind, kubectl; Helm comes from hack/get_helm.py. `make e2e-kind` builds the images first.
# KEEP_CLUSTER=1 keeps the cluster afterwards (it is also kept when a step fails, for a look).
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${CLUSTER:-trainhook-e2e}
IMAGE_REGISTRY=${IMAGE_REGISTRY:-ghcr.io/trainhook}
IMAGE_TAG=${IMAGE_TAG:-0.1.0}
TRAINING_NAMESPACE=e2e
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is needed" >&2; exit 2; }
done
helm=$(python3 hack/get_helm.py)
step() { echo "e2e-kind: $*"; }

step "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 180s
kubectl config use-context "kind-$CLUSTER"
step "loading $IMAGE_REGISTRY/{webhook,launcher}:$IMAGE_TAG into the nodes"
kind load docker-image --name "$CLUSTER" "$IMAGE_REGISTRY/webhook:$IMAGE_TAG" "$IMAGE_REGISTRY/launcher:$IMAGE_TAG"

step "helm install (self-managed certificates)"
"$helm" upgrade --install trainhook charts/trainhook --namespace trainhook --create-namespace --wait --timeout 5m \
  --set image.repository="$IMAGE_REGISTRY/webhook" --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never \
  --set launcherImage.repository="$IMAGE_REGISTRY/launcher" --set launcherImage.tag="$IMAGE_TAG"
# Ready replicas mean the caBundle is in place (readiness waits for it); check it is there anyway.
kubectl get mutatingwebhookconfiguration trainhook -o jsonpath='{.webhooks[*].clientConfig.caBundle}' | grep -q .

step "the PyTorch DDP example in namespace $TRAINING_NAMESPACE"
kubectl create namespace "$TRAINING_NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$TRAINING_NAMESPACE" apply -f examples/pytorch/ddp.yaml
digests() {  # the digest each rank printed when its training ended (in the current or the previous container run)
  local i logs
  for i in 0 1 2 3; do
    logs=$(kubectl -n "$TRAINING_NAMESPACE" logs "ddp-$i" -c trainer 2>/dev/null || true)
    logs+=$'\n'$(kubectl -n "$TRAINING_NAMESPACE" logs --previous "ddp-$i" -c trainer 2>/dev/null || true)
    sed -n '/final parameters digest [0-9a-f]* identical-across-ranks=True/{s/.*final parameters digest \([0-9a-f]*\) .*/\1/p;q;}' <<<"$logs"
  done
}
deadline=$((SECONDS + ${TIMEOUT:-1200}))  # the first pull of the PyTorch image takes minutes
until [[ $(digests | grep -c .) == 4 ]]; do
  if ((SECONDS > deadline)); then
    kubectl -n "$TRAINING_NAMESPACE" get pods -o wide; kubectl -n "$TRAINING_NAMESPACE" logs ddp-0 -c trainer --tail=30 || true
    echo "e2e-kind: FAILED: the 4 ranks did not all finish training" >&2; exit 1
  fi
  sleep 10
done
(( $(digests | sort -u | wc -l) == 1 )) || { echo "e2e-kind: FAILED: ranks ended with different parameters" >&2; exit 1; }
step "OK: 4 ranks trained, identical parameters ($(digests | head -n1))"
[[ ${KEEP_CLUSTER:-} == 1 ]] || kind delete cluster --name "$CLUSTER"
