"""The vocabulary shortlist (decoding/shortlist.py): exact with every token, within the
shortlist otherwise, the same in an exported SavedModel and in CTranslate2's `use_vmap`."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data.sources import load_pairs
from keras_transformer.decoding import beam_search
from keras_transformer.decoding.shortlist import (
    ShortlistStep,
    VocabularyMap,
    batch_shortlist,
    run_vocabulary_map,
)
from keras_transformer.decoding.text import encode_source
from keras_transformer.export import TranslationModule
from keras_transformer.layers import SharedEmbedding
from keras_transformer.runs import load_run

NUM_SENTENCES = 64


@pytest.fixture(scope="module")
def sources(run_model):
    model, tokenizer, config = run_model
    texts = [source for source, _ in load_pairs("builtin", "test")[:NUM_SENTENCES]]
    return texts, np.asarray(encode_source(tokenizer, texts, config.max_length))


@pytest.fixture(scope="module")
def vocabulary_map(trained_run):
    return run_vocabulary_map(trained_run, per_source=3, frequent=5)


def test_map_ranks_by_dice_and_frequency():
    """Dice 2 c(s, t) / (c(s) + c(t)) over sentences ranks, the co-occurrence count breaks
    its ties; PAD and BOS are never candidates; `always` is by token frequency."""
    pairs = [
        ([5, 6, 3], [9, 8, 8, 3]),
        ([5, 3], [9, 3]),
        ([6, 3], [8, 8, 7, 3]),
        ([7, 3], [8, 2, 0, 3]),
    ]
    vmap = VocabularyMap.build(pairs, vocabulary_size=12, per_source=2, frequent=2)
    assert vmap.candidates[5].tolist() == [9, 3]  # Dice 9: 4/4, 3: 4/6, 8: 2/5
    assert vmap.candidates[6].tolist() == [
        8,
        3,
    ]  # Dice 8: 4/5; 3: 4/6 and 7: 2/3, 3 co-occurs twice
    assert vmap.candidates[7].tolist() == [8, 3]  # not the BOS (2) or PAD (0) of its target
    assert vmap.candidates[0].tolist() == [0, 0] and vmap.candidates[11].tolist() == [0, 0]
    assert vmap.always.tolist() == [8, 3]
    assert vmap.shortlist([[5, 3, 0]]).tolist() == [0, 1, 2, 3, 8, 9]


def test_graph_shortlist_equals_the_maps(vocabulary_map, sources):
    _, source_ids = sources
    graph = tf.function(batch_shortlist)(
        tf.constant(vocabulary_map.candidates),
        tf.constant(vocabulary_map.always),
        tf.constant(source_ids),
    )
    assert graph.numpy().tolist() == vocabulary_map.shortlist(source_ids).tolist()


def test_shortlist_of_every_token_is_the_exact_search(run_model, sources):
    """Every output and score equal the full-vocabulary search's (n-best included)."""
    model, _, config = run_model
    _, source_ids = sources
    every_token = VocabularyMap.every_token(config.vocabulary_size)
    exact_ids, exact_scores = beam_search(model, source_ids, beam_size=4, num_return=2)
    ids, scores = beam_search(
        ShortlistStep(model, every_token), source_ids, beam_size=4, num_return=2
    )
    np.testing.assert_array_equal(ids.numpy(), exact_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), exact_scores.numpy())


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_shortlisted_projection_is_the_full_one_at_its_ids(quantization):
    """`SharedEmbedding(hidden, reverse=True, output_ids=ids)` gives the full projection's
    logits at `ids`, float32 and int8 (kernel rows with their own scales)."""
    layer = SharedEmbedding(vocabulary_size=40, embedding_dim=8)
    layer.build((None, None))
    layer.embeddings.assign(np.random.default_rng(0).normal(size=(40, 8)).astype("float32"))
    if quantization:
        layer.quantize(quantization)
    hidden = tf.constant(np.random.default_rng(1).normal(size=(3, 2, 8)).astype("float32"))
    ids = tf.constant([0, 3, 7, 8, 21, 39])
    full = layer(hidden, reverse=True).numpy()
    np.testing.assert_allclose(
        layer(hidden, reverse=True, output_ids=ids).numpy(),
        full[..., ids.numpy()],
        rtol=1e-6,
        atol=1e-6,
    )  # fewer columns, the same sums


def test_int8_shortlist_of_every_token_is_the_exact_search(trained_run, sources):
    """The int8 model searches its every-token shortlist as it searches the full vocabulary
    (its per-token scales are taken with the kernel rows)."""
    model, _, config = load_run(trained_run, quantization="int8")
    _, source_ids = sources
    every_token = VocabularyMap.every_token(config.vocabulary_size)
    exact_ids, exact_scores = beam_search(model, source_ids[:16], beam_size=4)
    ids, scores = beam_search(ShortlistStep(model, every_token), source_ids[:16], beam_size=4)
    np.testing.assert_array_equal(ids.numpy(), exact_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), exact_scores.numpy())


def test_outputs_stay_in_the_batch_shortlist(run_model, vocabulary_map, sources):
    model, _, _ = run_model
    _, source_ids = sources
    ids, scores = beam_search(ShortlistStep(model, vocabulary_map), source_ids, beam_size=4)
    allowed = set(vocabulary_map.shortlist(source_ids).tolist()) - {2}  # BOS never comes out
    assert set(np.unique(ids.numpy()).tolist()) <= allowed
    assert np.all(np.isfinite(scores.numpy()))
    assert len(allowed) < model.config.vocabulary_size // 2  # a real shortlist


def test_constraint_and_untied_output_are_refused(run_model, vocabulary_map, sources):
    from keras_transformer import Transformer, get_preset
    from keras_transformer.decoding import TreeConstraint

    model, _, _ = run_model
    _, source_ids = sources
    with pytest.raises(ValueError, match="full vocabulary"):
        beam_search(
            ShortlistStep(model, vocabulary_map),
            source_ids[:2],
            constraint=TreeConstraint.__new__(TreeConstraint),
        )
    untied = Transformer(
        get_preset(
            "tiny",
            vocabulary_size=model.config.vocabulary_size,
            num_encoder_layers=1,
            num_decoder_layers=1,
            hidden_dim=16,
            intermediate_dim=16,
            num_heads=2,
            tie_output=False,
        )
    )
    with pytest.raises(ValueError, match="tie_output=False"):
        beam_search(ShortlistStep(untied, vocabulary_map), source_ids[:2])
    with pytest.raises(ValueError, match="different vocabularies"):
        ShortlistStep(model, VocabularyMap(np.zeros((7, 2), np.int32), np.zeros(0, np.int32)))


def test_saved_model_with_a_map_translates_as_the_step(
    run_model, vocabulary_map, sources, tmp_path
):
    """A real export (ops checked against the model server's) of a module with the map,
    loaded back: the same token ids as `ShortlistStep` in process."""
    from keras_transformer.export import export_saved_model

    model, tokenizer, _ = run_model
    texts, source_ids = sources
    module = TranslationModule(model, tokenizer, beam_size=4, vocabulary_map=vocabulary_map)
    assert module.settings["vocabulary_map"] == "3 per source token + 5 frequent"
    exported = export_saved_model(module, tmp_path, name="shortlist", verify=False, check_ops=True)
    loaded = tf.saved_model.load(str(exported.path))
    served = loaded.signatures["translate_ids"](source_ids=tf.constant(source_ids))[
        "token_ids"
    ].numpy()
    ids, _ = beam_search(
        ShortlistStep(model, vocabulary_map),
        source_ids,
        beam_size=4,
        max_output_offset=module.max_output_offset,
    )
    ids = ids.numpy()[:, 0]
    width = min(served.shape[1], ids.shape[1])
    np.testing.assert_array_equal(served[:, :width], ids[:, :width])


def test_ctranslate2_vmap_file_is_the_same_shortlist(
    trained_run, run_model, vocabulary_map, sources, tmp_path
):
    """CTranslate2 with the map's `vmap.txt` and `use_vmap=True` keeps to the same shortlist
    and agrees with our shortlisted search (length penalty 0: the same objective). It
    translates sentences of one source length per call, so ours does too: each call's
    shortlist is its own sentences'."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from keras_transformer.export.ctranslate2 import export_ctranslate2, translate_ctranslate2

    model, tokenizer, config = run_model
    texts, source_ids = sources
    path = export_ctranslate2(trained_run, tmp_path / "ct2", vocabulary_map=vocabulary_map)
    assert (path / "vmap.txt").read_text(encoding="utf-8").startswith("\t")
    translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=1)
    theirs, _ = translate_ctranslate2(
        translator,
        tokenizer,
        texts,
        beam_size=4,
        length_penalty=0.0,
        max_source_length=config.max_length,
        use_vmap=True,
    )
    lengths = (source_ids > 0).sum(axis=1)
    ours, within = [None] * len(texts), []
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        group = source_ids[rows][:, :length]
        ids, _ = beam_search(
            ShortlistStep(model, vocabulary_map), group, beam_size=4, length_penalty=0.0
        )
        allowed = set(vocabulary_map.shortlist(group).tolist())
        for row, output in zip(rows, ids.numpy()[:, 0].tolist()):
            ours[row] = [token for token in output if token]
            within.append(set(theirs[row]) <= allowed)
    assert all(within)
    agreement = np.mean([a == b for a, b in zip(ours, theirs)])
    assert agreement >= 0.95, agreement
