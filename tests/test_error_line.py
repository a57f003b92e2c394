"""A stage's one error line: newlines folded, and TensorFlow's quoted stack left out."""

from __future__ import annotations

import pytest

from contract.messages import error_line


def test_newlines_are_folded_and_nothing_else_changes():
    assert error_line("bad date '2026-02-30':\n  use YYYY-MM-DD") == (
        "error: bad date '2026-02-30': use YYYY-MM-DD"
    )


def test_a_tensorflow_op_error_keeps_its_node_and_cause_without_the_stack():
    tf = pytest.importorskip("tensorflow")

    @tf.function
    def out_of_range(values):
        return tf.gather(values, [5])

    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        out_of_range(tf.constant([1, 2]))
    message = str(caught.value)
    assert 'File "' in message  # what TensorFlow quotes, and the line leaves out
    line = error_line(message)
    assert "\n" not in line and 'File "' not in line and "most recent call last" not in line
    assert line.startswith("error: Graph execution error: Detected at node GatherV2: ")
    assert "indices[0] = 5 is not in [0, 2)" in line
    assert line.endswith("[[{{node GatherV2}}]] [Op:" + message.rsplit("[Op:", 1)[1])
