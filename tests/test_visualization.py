"""Attention heatmaps and training curves written as PNG files."""

import matplotlib.image
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import visualization
from keras_transformer.visualization import (
    attention_maps,
    figure_size,
    plot_attention,
    plot_attention_heads,
    plot_training_curves,
    read_run_scalars,
    read_scalars,
    run_pauses,
    run_start,
    without_pauses,
    write_scalar_events,
)
from tests.conftest import TRAINED_RUN_CONFIG, TRAINED_RUN_STEPS

NUM_LAYERS = TRAINED_RUN_CONFIG["num_encoder_layers"]
NUM_HEADS = TRAINED_RUN_CONFIG["num_heads"]


def image_size(path):
    """(height, width) in pixels of a PNG read back with matplotlib."""
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    return image.shape[:2]


def expected_pixels(size_inches, dpi=100):
    width, height = size_inches
    return round(height * dpi), round(width * dpi)


@pytest.fixture(scope="module")
def maps(run_model):
    model, tokenizer, _ = run_model
    return attention_maps(model, tokenizer, "twenty one thousand three")


def test_attention_maps_shapes_and_labels(maps, run_model):
    _, tokenizer, _ = run_model
    source_length, target_length = len(maps.source_pieces), len(maps.target_pieces)
    assert maps.source_pieces[-1] == "</s>" and maps.source_pieces[0].startswith("▁")
    assert maps.decoder_input_pieces == ["<s>"] + maps.target_pieces[:-1]
    assert maps.source == "twenty one thousand three"
    assert [m.shape for m in maps.encoder] == [
        (NUM_HEADS, source_length, source_length)
    ] * NUM_LAYERS
    assert [m.shape for m in maps.decoder] == [
        (NUM_HEADS, target_length, target_length)
    ] * NUM_LAYERS
    assert [m.shape for m in maps.cross] == [(NUM_HEADS, target_length, source_length)] * NUM_LAYERS
    for kind in visualization.KINDS:
        for layer in maps.layer_maps(kind):
            np.testing.assert_allclose(layer.sum(axis=-1), 1.0, atol=1e-5)  # softmax rows
    for layer in maps.decoder:  # causal: no weight on later decoder inputs
        assert np.all(np.triu(layer, k=1) == 0)
    translated = tokenizer.detokenize(tokenizer.tokenize(tf.constant([maps.translation]))).numpy()[
        0
    ]
    assert translated.decode("utf-8") == maps.translation


def test_attention_maps_of_a_forced_target(run_model):
    model, tokenizer, _ = run_model
    forced = attention_maps(model, tokenizer, "twenty one", target="einundzwanzig")
    assert forced.translation == "einundzwanzig" and forced.target_pieces[-1] == "</s>"
    pieces = [
        tokenizer.id_to_piece(int(i)) for i in tokenizer.tokenize(tf.constant(["einundzwanzig"]))[0]
    ]
    assert forced.target_pieces == pieces + ["</s>"]
    by_ids = attention_maps(model, tokenizer, "twenty one", target_ids=[5, 6, 3, 0, 0])
    assert len(by_ids.target_pieces) == 3 and by_ids.cross[0].shape[1] == 3


def test_plot_attention_writes_one_png_per_kind_and_layer(maps, tmp_path):
    paths = plot_attention(maps, tmp_path / "attention", prefix="sentence")
    names = [path.name for path in paths]
    assert names == [
        f"sentence_{kind}_layer{layer}.png"
        for kind in ("encoder", "decoder_self", "cross")
        for layer in range(NUM_LAYERS)
    ]
    sizes = {
        "encoder": (len(maps.source_pieces), len(maps.source_pieces)),
        "decoder_self": (len(maps.target_pieces), len(maps.target_pieces)),
        "cross": (len(maps.target_pieces), len(maps.source_pieces)),
    }
    for path in paths:
        kind = path.name.split("_", 1)[1].rsplit("_layer", 1)[0]
        assert image_size(path) == expected_pixels(figure_size(NUM_HEADS, *sizes[kind]))
    only = plot_attention(maps, tmp_path / "cross", kinds=["cross"], layers=[1], dpi=50)
    assert [path.name for path in only] == ["attention_cross_layer1.png"]
    assert image_size(only[0]) == expected_pixels(figure_size(NUM_HEADS, *sizes["cross"]), dpi=50)
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        plot_attention(maps, tmp_path, layers=[5])


def test_plot_attention_heads_checks_shapes(tmp_path):
    with pytest.raises(ValueError, match="row and 4 column labels"):
        plot_attention_heads(np.zeros((2, 3, 4)), ["a", "b"], list("wxyz"), tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"shape \(heads, queries, keys\)"):
        plot_attention_heads(np.zeros((3, 4)), list("abc"), list("wxyz"), tmp_path / "x.png")
    path = plot_attention_heads(
        np.full((5, 3, 4), 0.25), list("abc"), list("wxyz"), tmp_path / "five.png"
    )
    assert image_size(path) == expected_pixels(figure_size(5, 3, 4))  # a 2 x 4 grid, 3 axes hidden


def test_training_curves_from_the_run_logs(trained_run, tmp_path):
    scalars = read_run_scalars(trained_run)
    steps = list(range(60, TRAINED_RUN_STEPS + 1, 60))
    for tag in ("loss", "learning_rate", "tokens_per_second"):
        assert scalars["train"][tag].steps.tolist() == steps
    assert scalars["validation"]["loss"].steps.tolist() == [TRAINED_RUN_STEPS]
    assert np.all(np.diff(scalars["train"]["loss"].wall_times) > 0)
    path = plot_training_curves(
        trained_run, tmp_path / "plots" / "curves.png", dpi=60, figsize=(10, 5)
    )
    assert image_size(path) == (300, 600)
    with pytest.raises(FileNotFoundError, match="No TensorBoard logs"):
        plot_training_curves(tmp_path, tmp_path / "none.png")


def test_run_pauses_leave_out_the_time_between_a_stop_and_its_resumption(tmp_path):
    """A run started at 1000 s, stopped after its event at 1130 s, resumed at 5000 s, stopped after
    5060 s and resumed at 9000 s: pauses of 3,870 s and 3,940 s, which training time leaves out."""
    from keras_transformer import runs

    run = tmp_path / "run"
    for step, time in ((0, 1000.0), (120, 5000.0), (180, 9000.0)):
        runs.record_start(run, {"step": step, "time": time})
    write_scalar_events(
        run / "logs" / "train",
        [
            (60, 1060.0, {"loss": 3.0}),
            (120, 1120.0, {"loss": 2.5}),
            (180, 5060.0, {"loss": 2.4}),
            (240, 9100.0, {"loss": 2.3}),
        ],
    )
    write_scalar_events(run / "logs" / "validation", [(120, 1130.0, {"loss": 2.9})])
    pauses = run_pauses(run)
    assert pauses == [(5000.0, 3870.0), (9000.0, 3940.0)]
    np.testing.assert_allclose(
        without_pauses([1060.0, 1130.0, 5060.0, 9100.0], pauses), [1060.0, 1130.0, 1190.0, 1290.0]
    )
    assert run_pauses(run, read_run_scalars(run)) == pauses
    assert run_start(run) == 1000.0  # the first start, not the first event (1060 s)
    path = plot_training_curves(
        run, tmp_path / "curves.png", dpi=60, figsize=(10, 5), skip_pauses=True
    )
    assert image_size(path) == (300, 600)


def test_a_run_without_recorded_starts_begins_at_its_first_logged_event(tmp_path):
    run = tmp_path / "run"
    write_scalar_events(
        run / "logs" / "train", [(60, 1060.0, {"loss": 3.0}), (120, 1120.0, {"loss": 2.5})]
    )
    write_scalar_events(run / "logs" / "validation", [(60, 1050.0, {"loss": 2.9})])
    assert run_start(run) == 1050.0
    with pytest.raises(ValueError, match="records no start"):
        run_start(tmp_path / "empty", scalars={"train": {}})


def test_read_scalars_merges_event_files(tmp_path):
    for values in ({1: 5.0, 2: 4.0}, {2: 3.5, 3: 3.0}):  # a resumed run re-logs step 2
        writer = tf.summary.create_file_writer(str(tmp_path))
        with writer.as_default():
            for step, value in values.items():
                tf.summary.scalar("loss", value, step=step)
        writer.close()
    series = read_scalars(tmp_path)["loss"]
    assert series.steps.tolist() == [1, 2, 3]
    np.testing.assert_allclose(series.values, [5.0, 3.5, 3.0])
    assert read_scalars(tmp_path / "missing") == {}


def test_scalar_events_keep_the_given_wall_times(tmp_path):
    log_dir = tmp_path / "checkpoints"
    (log_dir).mkdir()
    (log_dir / "events.out.tfevents.1.old").write_bytes(b"")  # replaced, not merged
    records = [
        (200, 1000.5, {"bleu": 12.5, "chrf": 40.0}),
        (100, 900.25, {"bleu": 3.0, "chrf": 20.0}),
    ]
    path = write_scalar_events(log_dir, records)
    assert [p.name for p in log_dir.iterdir()] == [path.name]
    scalars = read_scalars(log_dir)
    assert sorted(scalars) == ["bleu", "chrf"]
    assert scalars["bleu"].steps.tolist() == [100, 200]
    np.testing.assert_allclose(scalars["bleu"].wall_times, [900.25, 1000.5])
    np.testing.assert_allclose(scalars["chrf"].values, [20.0, 40.0])
    # TensorBoard's own reader accepts the file.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    assert [(e.step, e.wall_time, e.value) for e in accumulator.Scalars("bleu")] == [
        (100, 900.25, 3.0),
        (200, 1000.5, 12.5),
    ]
