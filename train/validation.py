"""Exact validation: every worker scores a disjoint slice, then sums and counts are all-reduced."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from contract.manifest import ManifestError


class ValidationCountError(ManifestError):
    """The workers together scored a different number of examples than the manifest lists."""


def sync_batch_norm_statistics(model: keras.Model) -> None:
    """Sets every worker's moving statistics to the cross-worker mean (what a save would store).

    Batch norm keeps per-worker moving statistics (ON_READ variables); reading one outside a
    replica is a collective MEAN. Every worker calls this in the same order.
    """
    for variable in model.non_trainable_variables:
        if variable.synchronization == tf.VariableSynchronization.ON_READ:
            variable.assign(variable.read_value())


class ExactValidation(keras.callbacks.Callback):
    """Adds val_loss and val_accuracy of `scored` over the whole validation split to the logs.

    `scored` is the model that will be exported (the trained one, or it with test-time flips).
    Must come before EarlyStopping and ReduceLROnPlateau in the callback list, so they decide
    on the same, exact numbers on every worker.
    """

    def __init__(
        self,
        scored: keras.Model,
        dataset: tf.data.Dataset,
        strategy: tf.distribute.Strategy,
        expected_count: int,
        collective_options: tf.distribute.experimental.CommunicationOptions | None = None,
        autograph: bool = True,
    ) -> None:
        """`autograph=False` traces the scoring as written, as the train step of a built-in
        model is (see train.trainer.Trainer): autograph's source conversion of the model's
        layers changes nothing there and costs each worker CPU at every start."""
        super().__init__()
        self.collective_options = collective_options
        self.autograph = autograph
        self.scored = scored
        self.dataset = dataset
        self.strategy = strategy
        self.expected_count = expected_count
        self._score_batch: Any = None

    def _batch_sums(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        probabilities = self.scored(images, training=False)
        losses = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
        predicted = tf.argmax(probabilities, axis=-1, output_type=labels.dtype)
        correct = tf.cast(tf.equal(predicted, labels), tf.float64)
        return tf.stack(
            [
                tf.reduce_sum(tf.cast(losses, tf.float64)),
                tf.reduce_sum(correct),
                tf.cast(tf.size(labels), tf.float64),
            ]
        )

    def evaluate(self) -> dict[str, float]:
        """Scores the whole validation split across workers; a collective, so all must call it."""
        sync_batch_norm_statistics(self.scored)
        if self._score_batch is None:
            # Inside strategy.run the model reads each worker's local (now synced) values.
            self._score_batch = tf.function(
                lambda x, y: self.strategy.run(self._batch_sums, args=(x, y)),
                autograph=self.autograph,
            )
        local = tf.zeros([3], tf.float64)
        for images, labels in self.dataset:
            local += self.strategy.experimental_local_results(self._score_batch(images, labels))[0]
        # Once per epoch, so running this collective eagerly costs nothing worth a graph.
        total = self.strategy.run(
            lambda t: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, t, options=self.collective_options
            ),
            args=(local,),
        )
        loss_sum, correct, count = self.strategy.experimental_local_results(total)[0].numpy()
        if int(count) != self.expected_count:
            raise ValidationCountError(
                f"validation scored {int(count)} examples but the manifest lists "
                f"{self.expected_count}: the validation files do not match the manifest"
            )
        return {"val_loss": float(loss_sum / count), "val_accuracy": float(correct / count)}

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs.update(self.evaluate())
