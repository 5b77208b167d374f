"""The training runtimes a Kubeflow Trainer v2 `TrainJob` names (`spec.runtimeRef`), for `trainhook convert`.

A TrainJob holds only what a user changes (image, command, node count); the rest of its pods (the JobSet template,
the ML policy) is in the runtime it names, a ClusterTrainingRuntime or a namespaced TrainingRuntime. convert finds
it in the input (a runtime manifest in the same YAML stream, or one given with `--runtime FILE`), else, for a
ClusterTrainingRuntime, among Trainer's three built-in runtimes below, which a Trainer install creates in every
cluster. They are minimal transcriptions of kubeflow/trainer's manifests/base/runtimes/ (torch_distributed.yaml,
deepspeed_distributed.yaml, mpi_distributed.yaml): the ML policy, the replicated jobs, their `node` containers,
images and commands, the labels Trainer reads. A cluster whose admin changed one is converted faithfully only from
its own manifest: `kubectl get clustertrainingruntime NAME -o yaml > runtime.yaml`, then `--runtime runtime.yaml`.
"""

from __future__ import annotations

import copy

import yaml

from trainhook.convert.policies import ConvertError

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINER_GROUP = "trainer.kubeflow.org"
CLUSTER_RUNTIME, RUNTIME = "ClusterTrainingRuntime", "TrainingRuntime"
RUNTIME_KINDS = (CLUSTER_RUNTIME, RUNTIME)
# The label on a runtime's replicated job that says which step it runs (Trainer's constants.LabelTrainJobAncestor).
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_STEP, DATASET_STEP, MODEL_STEP = "trainer", "dataset-initializer", "model-initializer"

_BUILTIN_YAML = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: torch-distributed
  labels:
    trainer.kubeflow.org/framework: torch
spec:
  mlPolicy:
    numNodes: 1
    torch:
      numProcPerNode: auto
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: deepspeed-distributed
  labels:
    trainer.kubeflow.org/framework: deepspeed
spec:
  mlPolicy:
    numNodes: 1
    mpi:
      numProcPerNode: 1
      mpiImplementation: OpenMPI
      sshAuthMountPath: /home/mpiuser/.ssh
      runLauncherAsNode: true
  template:
    spec:
      network:
        publishNotReadyAddresses: true
      successPolicy:
        operator: All
        targetReplicatedJobs:
          - launcher
      replicatedJobs:
        - name: launcher
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: ghcr.io/kubeflow/trainer/deepspeed-runtime
                      securityContext:
                        runAsUser: 1000
        - name: node
          template:
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: ghcr.io/kubeflow/trainer/deepspeed-runtime
                      securityContext:
                        runAsUser: 1000
                      command:
                        - /usr/sbin/sshd
                      args:
                        - -De
                        - -f
                        - /home/mpiuser/.sshd_config
                      readinessProbe:
                        tcpSocket:
                          port: 2222
                        initialDelaySeconds: 5
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: mpi-distributed
  labels:
    trainer.kubeflow.org/framework: mpi
spec:
  mlPolicy:
    numNodes: 1
    mpi:
      numProcPerNode: 1
      mpiImplementation: OpenMPI
      sshAuthMountPath: /home/mpiuser/.ssh
      runLauncherAsNode: true
  template:
    spec:
      network:
        publishNotReadyAddresses: true
      successPolicy:
        operator: All
        targetReplicatedJobs:
          - launcher
      replicatedJobs:
        - name: launcher
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: mpioperator/mpi-pi:openmpi
                      securityContext:
                        runAsUser: 1000
                      command:
                        - mpirun
                      args:
                        - /home/mpiuser/pi
        - name: node
          template:
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: mpioperator/mpi-pi:openmpi
                      securityContext:
                        runAsUser: 1000
                      command:
                        - /usr/sbin/sshd
                      args:
                        - -De
                        - -f
                        - /home/mpiuser/.sshd_config
                      readinessProbe:
                        tcpSocket:
                          port: 2222
                        initialDelaySeconds: 5
"""

BUILTIN: dict[str, dict] = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(_BUILTIN_YAML)}


def is_runtime(obj: dict) -> bool:
    return str(obj.get("apiVersion", "")).startswith(TRAINER_GROUP + "/") and obj.get("kind") in RUNTIME_KINDS


def runtime_name(obj: dict) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"


def find_runtime(ref: dict, namespace: str | None, given: list[dict], where: str) -> dict:
    """The runtime `spec.runtimeRef` names (a deep copy): from `given` (the input's and `--runtime`'s runtimes),
    else Trainer's built-in ClusterTrainingRuntimes; anything else is refused, naming how to supply it."""
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        raise ConvertError(f"{where}: spec.runtimeRef.name is required (e.g. torch-distributed)")
    group = ref.get("apiGroup") or TRAINER_GROUP
    kind = ref.get("kind") or CLUSTER_RUNTIME
    if group != TRAINER_GROUP or kind not in RUNTIME_KINDS:
        raise ConvertError(f"{where}: spec.runtimeRef names {group} {kind} {name}: a TrainJob's runtime is a "
                           f"{TRAINER_GROUP} {CLUSTER_RUNTIME} or {RUNTIME}")
    for runtime in given:
        meta = runtime.get("metadata") or {}
        if runtime.get("kind") != kind or meta.get("name") != name:
            continue
        if kind == RUNTIME and meta.get("namespace") and namespace and meta["namespace"] != namespace:
            continue  # a TrainingRuntime serves the TrainJobs of its own namespace only
        if runtime.get("apiVersion") != TRAINER_API:
            raise ConvertError(f"{where}: {runtime_name(runtime)} is {runtime.get('apiVersion')}: convert reads "
                               f"{TRAINER_API}")
        return copy.deepcopy(runtime)
    if kind == CLUSTER_RUNTIME and name in BUILTIN:
        return copy.deepcopy(BUILTIN[name])
    builtin = f"Trainer's built-in {', '.join(BUILTIN)}, or " if kind == CLUSTER_RUNTIME else ""
    scope = f"clustertrainingruntime {name}" if kind == CLUSTER_RUNTIME else \
        f"trainingruntime {name}{f' -n {namespace}' if namespace else ''}"
    raise ConvertError(f"{where}: spec.runtimeRef names {kind} {name}, which is not in the input: name "
                       f"{builtin}give its manifest in the same file or with --runtime FILE (kubectl get {scope} -o "
                       f"yaml > runtime.yaml; trainhook convert trainjob.yaml --runtime runtime.yaml)")
