# trainhook: `make demo` sets up and runs a real 4-pod DDP training locally; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The demo needs trainhook and torch, nothing else; the tests add every framework (requirements-test.txt).
TORCH := torch==2.13.0
# pip's default index gives Linux torch's CUDA build (several GB); the CPU build alone, as the demo needs:
#   make demo TORCH_PIP="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP ?=
DEMO_STAMP := $(VENV)/.demo-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
TEST_STAMP := $(VENV)/.test-$(shell cat pyproject.toml requirements-test.txt | sha1sum | cut -c1-12)

.PHONY: demo test install install-demo lint clean bench bench-gang bench-scale fuzz helm-lint helm-template images e2e-kind k8s-build cluster-up cluster-down

demo: install-demo  ## create the virtualenv, install trainhook and torch only, and train examples/pytorch/ddp.yaml on 4 local pods
	@echo "==> training examples/pytorch/ddp.yaml on 4 local pods through the real webhook (trainhook local, root)"
	$(BIN)/trainhook local examples/pytorch/ddp.yaml
	@echo "==> done: the StatefulSet above trained as one gang, wired by the webhook; its pods' output is above, each"
	@echo "    line prefixed [ddp-N]. Next: $(BIN)/trainhook explain examples/pytorch/ddp.yaml (what each pod gets),"
	@echo "    docs/use/local.md (keeping logs: --keep-dir), README.md (on a cluster: kubectl apply -f the same file)"

test: lint  ## every test, as CI runs it, after the checks (make lint)
	$(BIN)/python -m pytest -q

# Each tool reads the checkout as it is: trainhook/webhook/ is trainhook.webhook (docs/develop/checks.md).
lint: install  ## ruff, the import contracts (lint-imports) and mypy, as configured in pyproject.toml (hack/lint.py)
	$(BIN)/python hack/lint.py

install-demo: $(DEMO_STAMP)

install: $(TEST_STAMP)

# pip's own lines are the progress (no --quiet): installing torch is most of the first run's time.
$(DEMO_STAMP):
	@echo "==> 1/3 creating the virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> 2/3 installing $(TORCH), the longest step (pip prints each package as it goes)"
	$(BIN)/pip install $(TORCH_PIP) $(TORCH)
	@echo "==> 3/3 installing trainhook and its dependencies"
	$(BIN)/pip install -e .
	rm -f $(VENV)/.demo-* && touch $@

$(TEST_STAMP): $(DEMO_STAMP)
	$(BIN)/pip install --quiet -r requirements-test.txt
	$(BIN)/pip install --quiet -e '.[test]'
	rm -f $(VENV)/.test-* && touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

bench: install  ## admission benchmark against the yardstick, and the plots (~8 min); see docs/develop/performance.md
	$(BIN)/pip install --quiet matplotlib
	$(BIN)/python bench/admission.py
	$(BIN)/python bench/plot.py

bench-gang: install  ## gang start of 8 local pods: trainhook local against torchrun by hand (root, ~10 min)
	$(BIN)/pip install --quiet matplotlib
	$(BIN)/python bench/gang_start.py
	$(BIN)/python bench/plot.py

# The gang at 100, 1,000 and 10,000 members against the real API server, webhook, notary and coordinator (issue 32;
# k8s-build's binaries, ~25 min in all, most of it the StatefulSet controller creating 10,000 pods at its 20 requests
# a second); tests/cluster/test_scale_sim.py runs a short one in CI. SCALE_SIZES="100 1000" for less.
SCALE_SIZES ?= 100 1000 10000
bench-scale: install k8s-build  ## the gang at scale with real central parts: bench/results/gang-scale-N.json, the plot
	$(BIN)/pip install --quiet matplotlib
	mkdir -p bench/results && for n in $(SCALE_SIZES); do $(BIN)/python bench/gang_scale_sim.py --members $$n --json > bench/results/gang-scale-$$n.json || exit 1; done
	$(BIN)/python bench/plot.py

fuzz: install  ## atheris fuzzing of the review handler, 2,000,000 runs (~4 min)
	$(BIN)/pip install --quiet atheris
	$(BIN)/python bench/fuzz/fuzz_review.py -runs=2000000 -print_final_stats=1 bench/fuzz/corpus

CHART := charts/trainhook
helm-lint:  ## helm lint --strict the chart (Helm v4 fetched by hack/get_helm.py)
	helm=$$($(PYTHON) hack/get_helm.py) && $$helm lint --strict $(CHART) && $$helm lint --strict $(CHART) -f tests/chart/data/values-full.yaml

helm-template:  ## print the chart's manifests with default values
	@helm=$$($(PYTHON) hack/get_helm.py) && $$helm template trainhook $(CHART) --namespace trainhook

IMAGE_REGISTRY ?= ghcr.io/trainhook
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/trainhook/Chart.yaml)

images:  ## build the webhook and launcher images (needs Docker; no container engine runs on the CI machines)
	docker build -f images/webhook.Dockerfile -t $(IMAGE_REGISTRY)/webhook:$(IMAGE_TAG) .
	docker build -f images/launcher.Dockerfile -t $(IMAGE_REGISTRY)/launcher:$(IMAGE_TAG) .

e2e-kind: images  ## kind cluster, images loaded, helm install, the PyTorch example to completion (needs Docker, kind, kubectl; not run in CI)
	IMAGE_REGISTRY=$(IMAGE_REGISTRY) IMAGE_TAG=$(IMAGE_TAG) hack/e2e-kind.sh

k8s-build:  ## build kube-apiserver/-controller-manager/-scheduler v1.20.2 into ~/.cache/trainhook (once; see docs/develop/control-plane.md)
	bash hack/k8s-build.sh

cluster-up: install k8s-build  ## start a local v1.20 control plane; prints `export KUBECONFIG=...`
	$(BIN)/python hack/cluster.py up

cluster-down:  ## stop what cluster-up started
	$(PYTHON) hack/cluster.py down

# -- A real node (docs/develop/control-plane.md): kubelet, containerd, pod network, cluster DNS, the chart by Helm -------
.PHONY: node-build node-images node-up node-down e2e
NODE := $(BIN)/python hack/node.py

node-build:  ## kubelet, kube-proxy, kubectl and pause besides the control plane (once; cached in ~/.cache/trainhook)
	bash hack/k8s-build.sh all

node-images: install node-build  ## the node's images, built here from images/ (cached by input hash in ~/.cache/trainhook/images)
	$(BIN)/python hack/images.py build >/dev/null

node-up: install node-images  ## start the node (root); prints `export KUBECONFIG=... PATH=...`
	$(NODE) up

node-down:  ## stop the node: every process by PID, mounts, cgroups, iptables, bridge, sysctls (safe twice)
	$(PYTHON) hack/node.py down

e2e: install node-images  ## bring the node up, run tests/e2e, bring it down (whatever the tests did)
	$(NODE) up >/dev/null
	$(BIN)/python -m pytest -q tests/e2e; rc=$$?; $(PYTHON) hack/node.py down; exit $$rc
