"""The vocabulary shortlist (decoding/shortlist.py): exact with every token, within the
shortlist otherwise, the same in an exported SavedModel and in CTranslate2's `use_vmap`; and
for a model whose decoder has a vocabulary of its own (`target_vocabulary_size`)."""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data.sources import load_pairs
from keras_transformer.data.tokenizer import EOS_ID
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
from keras_transformer.models.config import get_preset
from keras_transformer.models.transformer import Transformer
from keras_transformer.runs import load_run
from tests.scripts import assign_random_weights

NUM_SENTENCES = 64
SOURCE_SIZE = 40  # the separate-vocabulary models' source vocabulary
UNUSED_TARGET_PIECES = 20  # added to the separate run's target vocabulary


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
        vocabulary_map.target_vocabulary_size,
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


def _ctranslate2_against_ours(model_dir, vocabulary_map, texts, output_dir):
    """CTranslate2 with `model_dir`'s export holding `vocabulary_map` (`vmap.txt`,
    `use_vmap=True`) against our shortlisted search (length penalty 0: the same objective):
    `(each output within its call's shortlist, the share of equal outputs)`. CTranslate2
    translates sentences of one source length per call, so ours does too: each call's
    shortlist is its own sentences'."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from keras_transformer.export.ctranslate2 import export_ctranslate2, translate_ctranslate2

    model, tokenizer, config = load_run(model_dir)
    source_ids = np.asarray(encode_source(tokenizer, texts, config.max_length))
    path = export_ctranslate2(model_dir, output_dir, vocabulary_map=vocabulary_map)
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
    return all(within), np.mean([a == b for a, b in zip(ours, theirs)])


def test_ctranslate2_vmap_file_is_the_same_shortlist(
    trained_run, vocabulary_map, sources, tmp_path
):
    """CTranslate2 with the map's `vmap.txt` keeps to the same shortlist and agrees with our
    shortlisted search."""
    texts, _ = sources
    within, agreement = _ctranslate2_against_ours(
        trained_run, vocabulary_map, texts, tmp_path / "ct2"
    )
    assert within
    assert agreement >= 0.95, agreement


# --- a decoder vocabulary of its own (`target_vocabulary_size`, e.g. an OPUS-MT import) ---


@pytest.fixture(scope="module", params=[29, 57], ids=["smaller_target", "larger_target"])
def separate_model(request):
    """A tiny model (random weights) whose decoder has `request.param` tokens of its own
    against SOURCE_SIZE source tokens, the output projection tied to the target embedding
    (pre-LN: its searches produce several tokens, not one repeated)."""
    config = get_preset(
        "tiny",
        vocabulary_size=SOURCE_SIZE,
        target_vocabulary_size=request.param,
        share_embeddings=False,
        normalize_first=True,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=16,
        intermediate_dim=32,
        num_heads=2,
        max_length=24,
    )
    model = Transformer(config, dtype="float32")
    assign_random_weights(model)
    return model


def _random_sources(rng, lengths, vocabulary_size=SOURCE_SIZE):
    """Source rows of `lengths` random tokens, then EOS, then PAD."""
    rows = np.zeros((len(lengths), max(lengths) + 1), np.int32)
    for row, length in zip(rows, lengths):
        row[:length] = rng.integers(4, vocabulary_size, size=length)
        row[length] = EOS_ID
    return rows


def test_separate_target_vocabulary_every_token_is_the_exact_search(separate_model):
    """Every output and score of the every-token map's search equal the exact search's, for a
    target vocabulary smaller and larger than the source's (ids past the source's produced)."""
    config = separate_model.config
    source_ids = _random_sources(np.random.default_rng(1), [3, 9, 5, 1, 7, 4])
    every_token = VocabularyMap.every_token(config.vocabulary_size, config.decoder_vocabulary_size)
    search = dict(beam_size=4, num_return=4, max_output_offset=6)
    exact_ids, exact_scores = beam_search(separate_model, source_ids, **search)
    ids, scores = beam_search(ShortlistStep(separate_model, every_token), source_ids, **search)
    np.testing.assert_array_equal(ids.numpy(), exact_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), exact_scores.numpy())
    produced = np.unique(ids.numpy())
    assert produced.max() < config.decoder_vocabulary_size
    if config.decoder_vocabulary_size > SOURCE_SIZE:
        assert produced.max() >= SOURCE_SIZE


def test_separate_target_vocabulary_map_shortlists_target_ids(separate_model):
    """A map built from pairs of the model's two vocabularies: its graph shortlist is its own,
    the search keeps to it, and a map of the other sizes is refused naming both."""
    config = separate_model.config
    rng = np.random.default_rng(2)
    pairs = [
        (rng.integers(4, SOURCE_SIZE, size=6), rng.integers(4, config.decoder_vocabulary_size, 5))
        for _ in range(30)
    ]
    vmap = VocabularyMap.build(
        pairs, SOURCE_SIZE, 2, 2, target_vocabulary_size=config.decoder_vocabulary_size
    )
    source_ids = _random_sources(rng, [3, 5, 2])
    graph = batch_shortlist(
        tf.constant(vmap.candidates),
        tf.constant(vmap.always),
        tf.constant(source_ids),
        vmap.target_vocabulary_size,
    )
    assert graph.numpy().tolist() == vmap.shortlist(source_ids).tolist()
    ids, _ = beam_search(
        ShortlistStep(separate_model, vmap), source_ids, beam_size=4, max_output_offset=6
    )
    assert set(np.unique(ids.numpy()).tolist()) <= set(vmap.shortlist(source_ids).tolist())
    with pytest.raises(
        ValueError, match=r"target_vocabulary_size=40, .*=40 and decoder_vocabulary_size"
    ):
        ShortlistStep(separate_model, VocabularyMap.every_token(SOURCE_SIZE))


SEPARATE_PAIRS = [  # source ids < 6, target ids < 12
    ([4, 5, 3], [10, 11, 3]),
    ([4, 3], [10, 3]),
    ([5, 3], [11, 11, 7, 3]),
]


def test_separate_map_ranks_target_ids_past_the_source_size():
    """Sentence counts c(4) = c(5) = 2, c(3) = 3 (sources); c(10) = c(11) = 2, c(3) = 3,
    c(7) = 1 (targets). Dice for 4: 10 4/4, 3 4/5, 11 2/4; for 5: 11 4/4, 3 4/5, 7 2/3, 10 2/4;
    for 3: 3 6/6, 10 and 11 4/5 (tied twice: the lower id), 7 2/4. By tokens 3 and 11 occur
    three times each (the lower id first)."""
    vmap = VocabularyMap.build(
        SEPARATE_PAIRS, vocabulary_size=6, per_source=2, frequent=2, target_vocabulary_size=12
    )
    assert (vmap.vocabulary_size, vmap.target_vocabulary_size) == (6, 12)
    assert vmap.candidates.tolist() == [[0, 0], [0, 0], [0, 0], [3, 10], [10, 3], [11, 3]]
    assert vmap.always.tolist() == [3, 11]
    assert vmap.shortlist([[4, 3, 0]]).tolist() == [0, 1, 2, 3, 10, 11]
    assert vmap.shortlist([[5, 3]]).tolist() == [0, 1, 2, 3, 10, 11]
    with pytest.raises(ValueError, match="candidate 11, target_vocabulary_size=10"):
        VocabularyMap(vmap.candidates, vmap.always, target_vocabulary_size=10)


def test_separate_map_names_sources_and_targets_in_their_own_pieces(tmp_path):
    """CTranslate2's `vmap.txt`: source tokens in the source's pieces, candidates in the
    target's; pieces of other sizes are refused naming them."""
    vmap = VocabularyMap.build(
        SEPARATE_PAIRS, vocabulary_size=6, per_source=2, frequent=2, target_vocabulary_size=12
    )
    special = ["<pad>", "<unk>", "<s>", "</s>"]
    pieces = special + ["s4", "s5"]
    target_pieces = special + [f"t{i}" for i in range(4, 12)]
    vmap.write_ctranslate2(tmp_path / "vmap.txt", pieces, target_pieces)
    assert (tmp_path / "vmap.txt").read_text(encoding="utf-8").splitlines() == [
        "\t</s> t11",
        "</s>\t</s> t10",
        "s4\tt10 </s>",
        "s5\tt11 </s>",
    ]
    with pytest.raises(ValueError, match="6 source and 6 target pieces, a map of 6 rows"):
        vmap.write_ctranslate2(tmp_path / "bad.txt", pieces)


@pytest.fixture(scope="module")
def separate_run(multi30k_dir, tmp_path_factory):
    """A run with a Marian tokenizer pair of separate vocabularies (the target's larger: pieces
    its SentencePiece model never produces, as OPUS-MT's vocabularies have), trained-on data
    the embedded task, and a tiny model (random weights) of both as `checkpoints/ckpt-0`."""
    from keras_transformer.data.marian import MarianTokenizer
    from keras_transformer.pretrained import write_weights_checkpoint
    from keras_transformer.training import DataOptions, TrainOptions
    from keras_transformer.training.trainer import write_run_config
    from tests.test_marian_tokenizer import write_marian_tokenizer

    run = write_marian_tokenizer(
        tmp_path_factory.mktemp("separate_run") / "run", multi30k_dir, separate=True
    )
    path = run / "target_vocab.json"
    target = json.loads(path.read_text(encoding="utf-8"))
    target.update({f"▁unused{i}": len(target) + i for i in range(UNUSED_TARGET_PIECES)})
    path.write_text(json.dumps(target, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(run)
    config = get_preset(
        "tiny",
        vocabulary_size=tokenizer.vocabulary_size,
        target_vocabulary_size=tokenizer.target_vocabulary_size,
        share_embeddings=False,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=32,
        intermediate_dim=48,
        num_heads=4,
        max_length=48,
    )
    write_run_config(run, config, TrainOptions(), {"data": dataclasses.asdict(DataOptions())})
    model = Transformer(config, dtype="float32")
    assign_random_weights(model)
    write_weights_checkpoint(model, run)
    return run


def test_separate_run_map_and_ctranslate2_vmap(separate_run, tmp_path):
    """`run_vocabulary_map` of a run whose tokenizer has two vocabularies maps source ids to
    target ids; CTranslate2 with its `vmap.txt` keeps to the same shortlist as ours."""
    from keras_transformer.data.marian import MarianTokenizer
    from keras_transformer.export.ctranslate2 import vocabulary

    tokenizer = MarianTokenizer(separate_run)
    vmap = run_vocabulary_map(separate_run, per_source=3, frequent=5)
    assert (vmap.vocabulary_size, vmap.target_vocabulary_size) == (
        tokenizer.vocabulary_size,
        tokenizer.target_vocabulary_size,
    )
    assert tokenizer.target_vocabulary_size == tokenizer.vocabulary_size + UNUSED_TARGET_PIECES
    assert vocabulary(tokenizer, target=True)[:-UNUSED_TARGET_PIECES] != vocabulary(tokenizer)
    texts = [source for source, _ in load_pairs("builtin", "test")[:24]]
    within, agreement = _ctranslate2_against_ours(separate_run, vmap, texts, tmp_path / "ct2")
    assert within
    assert agreement >= 0.95, agreement
