"""Checkpoints written by older code load by their variables' names (`runs.read_model_weights`).

`tests/old_runs/tiny_6255743/` is a trainer-style checkpoint (model and built optimizer) of a
1 + 1-layer model written by commit 6255743, whose layers were created in another order: its
object graph lists the model's layers at other positions, so matching the graph alone
leaves weights unread (or swaps same-shaped ones); each weight's recorded name still
finds it (`tests/old_runs/README.md`).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import runs
from keras_transformer.models import build_model

OLD_RUN = Path(__file__).parent / "old_runs" / "tiny_6255743"
CHECKPOINT = OLD_RUN / "checkpoints" / "ckpt-1"


def _old_model():
    config, _ = runs.read_run_config(OLD_RUN)
    model = build_model(config)
    expected = json.loads((OLD_RUN / "logits.json").read_text())
    inputs = {key: np.array(expected[key], np.int32) for key in ("source_ids", "target_ids")}
    model(inputs)
    return model, inputs, np.array(expected["logits"])


def test_the_object_graph_alone_no_longer_finds_the_old_weights():
    """The case the names are for: TensorFlow's own restore leaves weights of this run unread."""
    model, _, _ = _old_model()
    with pytest.raises(AssertionError, match="not bound to checkpointed values"):
        tf.train.Checkpoint(model=model).read(
            str(CHECKPOINT)
        ).expect_partial().assert_existing_objects_matched()


def test_an_old_run_loads_by_names_and_gives_the_old_logits():
    model, inputs, logits = _old_model()
    runs.read_model_weights(model, CHECKPOINT)
    real = inputs["target_ids"] != 0  # today's model leaves padded positions' logits at 0
    np.testing.assert_allclose(model(inputs).numpy()[real], logits[real], rtol=0, atol=1e-6)


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    config, _ = runs.read_run_config(run)
    model = build_model(config.replace(num_decoder_layers=2))
    model({"source_ids": np.array([[4, 3]], np.int32), "target_ids": np.array([[2, 4]], np.int32)})
    with pytest.raises(runs.CheckpointReadError) as error:
        runs.read_model_weights(model, run / "checkpoints" / "ckpt-1")
    message = str(error.value)
    assert "\n" not in message and "ckpt-1 does not hold this model's weights" in message
    assert "decoder_layer_1/" in message
