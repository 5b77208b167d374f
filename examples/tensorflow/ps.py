"""ParameterServerStrategy training (chief + parameter servers + workers), as a Kubeflow TFJob would run it.

One script for every role; TensorFlow reads the cluster and this pod's task from TF_CONFIG, which trainhook's
webhook injects (Kubeflow's JSON).
- ps and worker tasks start a TensorFlow server and serve: the variables live on the parameter servers, the
  workers run the training steps the chief schedules on them.
- the chief is the coordinator: it builds the model under the strategy (its variables are placed on the
  parameter servers), schedules training steps on the workers and prints the mean loss per epoch.
A TensorFlow server never exits by itself, so ps and worker tasks watch the chief's port and exit 0 once the
chief, having come up, has gone away: the pods complete instead of serving forever.

Plain TensorFlow, no Keras, so it runs on the stock tensorflow/tensorflow image.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import socket  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "4"))
STEPS_PER_EPOCH = 10
BATCH = 32
LEARNING_RATE = 0.05
CHIEF_GONE_PROBES = 3  # consecutive refused connections that mean the chief has finished


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    """A ps or worker task: serve until the chief has come and gone."""
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
    chief = resolver.cluster_spec().task_address("chief", 0)
    print(f"{resolver.task_type}-{resolver.task_id}: serving at {server.target}; waiting for the chief at {chief}",
          flush=True)
    seen, gone = False, 0
    while gone < CHIEF_GONE_PROBES:
        time.sleep(0.5)
        if reachable(chief):
            seen, gone = True, 0
        elif seen:
            gone += 1
    print(f"{resolver.task_type}-{resolver.task_id}: the chief has finished; exiting", flush=True)


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    """y = x @ w_true + noise, endless; each worker draws its own samples."""
    seed = 1000 + context.input_pipeline_id
    x = tf.random.stateless_normal((BATCH * STEPS_PER_EPOCH, 8), seed=[seed, 0])
    w_true = tf.reshape(tf.range(1.0, 9.0) / 8, (8, 1))
    y = x @ w_true + 0.01 * tf.random.stateless_normal((BATCH * STEPS_PER_EPOCH, 1), seed=[seed, 1])
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)


def coordinate(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    """The chief: place the variables on the parameter servers, schedule training steps on the workers."""
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    workers = resolver.cluster_spec().num_tasks("worker")
    ps = resolver.cluster_spec().num_tasks("ps")
    print(f"chief: coordinating {workers} workers and {ps} parameter servers", flush=True)
    with strategy.scope():  # variables created here live on the parameter servers, round robin
        init = np.random.default_rng(0)
        params = [tf.Variable(value.astype("float32"), name=name)
                  for name, value in (("w1", 0.3 * init.standard_normal((8, 16))), ("b1", np.zeros(16)),
                                      ("w2", 0.3 * init.standard_normal((16, 1))), ("b2", np.zeros(1)))]
    places = sorted({param.device.split("/device:")[0] for param in params})
    print(f"chief: variables on {', '.join(places)}", flush=True)

    def model(x: tf.Tensor) -> tf.Tensor:
        w1, b1, w2, b2 = params
        return tf.tanh(x @ w1 + b1) @ w2 + b2

    @tf.function
    def step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            for param, grad in zip(params, tape.gradient(loss, params)):
                param.assign_sub(LEARNING_RATE * grad)  # asynchronous: each worker updates the ps directly
            return loss

        x, y = next(iterator)
        return strategy.run(replica_step, args=(x, y))

    def per_worker_dataset():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))
    for epoch in range(1, EPOCHS + 1):
        losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS_PER_EPOCH)]
        coordinator.join()
        mean = float(np.mean([loss.fetch() for loss in losses]))
        print(f"chief: epoch {epoch} loss {mean:.4f}", flush=True)


def main() -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        serve(resolver)
    else:
        coordinate(resolver)


if __name__ == "__main__":
    main()
