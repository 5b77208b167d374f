"""MultiWorkerMirroredStrategy training, unchanged from what a Kubeflow TFJob would run.

TensorFlow reads the cluster and this pod's task from TF_CONFIG, which trainhook's webhook injects (Kubeflow's
JSON). Every worker holds a full replica of a tiny regression model (y = tanh(x W1 + b1) W2 + b2) and trains
on its own samples; after each step the workers' updates are averaged with an all-reduce over gRPC, so they
end with identical weights. The script prints how many replicas train in sync, the loss per epoch, and a
digest of the final weights that the tests compare across pods.

Plain TensorFlow, no Keras, so it runs on the stock tensorflow/tensorflow image: TensorFlow >= 2.16 ships
Keras 3, whose `model.fit` does not run under MultiWorkerMirroredStrategy (for `model.fit` code, install
`tensorflow tf-keras` in one pip command and set TF_USE_LEGACY_KERAS=1; docs/use/frameworks/tensorflow.md).
"""

import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "3"))
STEPS_PER_EPOCH = 8
BATCH_PER_WORKER = 32
LEARNING_RATE = 0.05


def dataset(worker_index: int) -> tf.data.Dataset:
    """y = x @ w_true + noise, endless; each worker draws its own samples (a different seed per worker)."""
    rng = np.random.default_rng(1000 + worker_index)
    x = rng.standard_normal((BATCH_PER_WORKER * STEPS_PER_EPOCH, 8)).astype("float32")
    w_true = (np.arange(1.0, 9.0, dtype="float32") / 8).reshape(8, 1)
    y = x @ w_true + 0.01 * rng.standard_normal((len(x), 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH_PER_WORKER)


def main() -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    me = f"{resolver.task_type}-{resolver.task_id}"
    print(f"{me}: num_replicas_in_sync={strategy.num_replicas_in_sync}", flush=True)
    with strategy.scope():
        # MEAN aggregation: an update made in a replica is averaged across all replicas (an all-reduce) before
        # it is applied, so every replica applies the same averaged gradient step.
        init = np.random.default_rng(0)  # same initial values everywhere (the strategy also broadcasts them)
        params = [tf.Variable(value.astype("float32"), aggregation=tf.VariableAggregation.MEAN, name=name)
                  for name, value in (("w1", 0.3 * init.standard_normal((8, 16))), ("b1", np.zeros(16)),
                                      ("w2", 0.3 * init.standard_normal((16, 1))), ("b2", np.zeros(1)))]

    def model(x: tf.Tensor) -> tf.Tensor:
        w1, b1, w2, b2 = params
        return tf.tanh(x @ w1 + b1) @ w2 + b2

    @tf.function
    def train_step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            for param, grad in zip(params, tape.gradient(loss, params)):
                param.assign_sub(LEARNING_RATE * grad)
            return loss

        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    iterator = iter(strategy.experimental_distribute_dataset(
        dataset(resolver.task_id or 0),
        tf.distribute.InputOptions(experimental_fetch_to_device=False)))
    for epoch in range(1, EPOCHS + 1):
        loss = np.mean([train_step(iterator).numpy() for _ in range(STEPS_PER_EPOCH)])
        print(f"{me}: epoch {epoch} loss {loss:.4f}", flush=True)
    flat = np.concatenate([param.numpy().ravel() for param in params])
    print(f"{me}: final weights digest {hashlib.sha256(flat.tobytes()).hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
