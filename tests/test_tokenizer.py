"""Tests for SentencePiece training and the in-graph Tokenizer, on real Multi30k text."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from keras_transformer.data.corpus import load_multi30k
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_sentencepiece,
)

MULTI30K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
pytestmark = pytest.mark.skipif(
    not MULTI30K_DIR.is_dir(), reason=f"Multi30k copy not found at {MULTI30K_DIR}"
)

VOCAB_SIZE = 500


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    pairs = load_multi30k("en", "de", "train", data_dir=MULTI30K_DIR)[:1000]
    return [sentence for pair in pairs for sentence in pair]


@pytest.fixture(scope="module")
def model_path(sentences, tmp_path_factory) -> Path:
    return train_sentencepiece(
        sentences, tmp_path_factory.mktemp("spm") / "run" / "spm.model", vocabulary_size=VOCAB_SIZE
    )


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    return Tokenizer(model_path)


@pytest.fixture(scope="module")
def val_sentences() -> list[str]:
    pairs = load_multi30k("en", "de", "val", data_dir=MULTI30K_DIR)[:100]
    return [sentence for pair in pairs for sentence in pair]


def _normalized(sentence: str) -> str:
    """What SentencePiece's nmt_nfkc normalization does to plain text."""
    return " ".join(sentence.split())


def test_model_file_and_reserved_ids(model_path, tokenizer):
    assert model_path.name == "spm.model" and model_path.is_file()
    assert not [p for p in model_path.parent.iterdir() if p != model_path]
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    from keras_transformer.models import transformer

    assert transformer.PAD_ID == PAD_ID  # the model's copy (it does not import TensorFlow Text)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tokenizer.vocabulary_size == VOCAB_SIZE
    with pytest.raises(ValueError, match=f"Piece id {VOCAB_SIZE} is out of range"):
        tokenizer.id_to_piece(VOCAB_SIZE)


def test_round_trip_on_real_sentences(tokenizer, sentences, val_sentences):
    # Characters never seen in training map to <unk> and cannot round-trip.
    seen = set("".join(sentences))
    covered = [s for s in val_sentences if set(s) <= seen]
    assert len(covered) > 0.9 * len(val_sentences)
    ids = tokenizer.tokenize(covered)
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.dtype == tf.int32
    decoded = [s.decode("utf-8") for s in tokenizer.detokenize(ids).numpy()]
    assert decoded == [_normalized(s) for s in covered]


def test_unseen_characters_become_unk(tokenizer, sentences):
    unseen = next(c for c in "0123456789€" if c not in "".join(sentences))
    assert UNK_ID in tokenizer.tokenize(f"about {unseen} dogs").numpy().tolist()


def test_tokenize_adds_no_special_ids(tokenizer, val_sentences):
    flat = tokenizer.tokenize(val_sentences).flat_values.numpy()
    assert not np.isin(flat, [PAD_ID, BOS_ID, EOS_ID]).any()


def test_tokenize_single_string(tokenizer):
    ids = tokenizer.tokenize("A dog runs.")
    assert isinstance(ids, tf.Tensor) and ids.shape.rank == 1
    assert tokenizer.detokenize(ids).numpy() == b"A dog runs."


def test_detokenize_dense_and_ragged_ignores_specials(tokenizer):
    first = tokenizer.tokenize("A man is smiling.").numpy().tolist()
    second = tokenizer.tokenize("Zwei Hunde.").numpy().tolist()
    garbage = tokenizer.tokenize("ignored words").numpy().tolist()
    width = 2 + len(first) + len(garbage)
    dense = np.zeros((2, width), np.int64)
    row0 = [BOS_ID] + first + [EOS_ID] + garbage
    row1 = second + [EOS_ID]
    dense[0, : len(row0)] = row0
    dense[1, : len(row1)] = row1
    expected = [b"A man is smiling.", b"Zwei Hunde."]
    assert tokenizer.detokenize(dense).numpy().tolist() == expected
    assert tokenizer.detokenize(tf.constant(dense, tf.int32)).numpy().tolist() == expected
    assert tokenizer.detokenize([row0, row1]).numpy().tolist() == expected
    ragged = tf.ragged.constant([row0, row1 + [PAD_ID]])
    assert tokenizer.detokenize(ragged).numpy().tolist() == expected


def test_detokenize_rejects_bad_rank(tokenizer):
    with pytest.raises(ValueError, match="rank 1 or 2"):
        tokenizer.detokenize(tf.zeros([1, 2, 3], tf.int32))


def test_works_inside_tf_function(tokenizer, val_sentences):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(strings):
        ids = tokenizer.tokenize(strings)
        padded = ids.to_tensor(default_value=PAD_ID)
        return tokenizer.detokenize(padded)

    result = round_trip(tf.constant(val_sentences[:8]))
    assert [s.decode("utf-8") for s in result.numpy()] == [
        _normalized(s) for s in val_sentences[:8]
    ]


def test_survives_saved_model_export(tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = tokenizer
    module.round_trip = tf.function(
        lambda strings: tokenizer.detokenize(tokenizer.tokenize(strings)),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path / "saved"))
    restored = tf.saved_model.load(str(tmp_path / "saved"))
    assert restored.round_trip(tf.constant(["Ein Hund rennt."])).numpy().tolist() == [
        b"Ein Hund rennt."
    ]


def test_bytes_and_path_give_the_same_tokenizer(model_path, tokenizer, val_sentences):
    from_bytes = Tokenizer(model_path.read_bytes())
    assert from_bytes.model_proto == tokenizer.model_proto == model_path.read_bytes()
    assert (
        from_bytes.tokenize(val_sentences).to_list() == tokenizer.tokenize(val_sentences).to_list()
    )


def test_keras_hub_tokenizer_gives_identical_ids(tokenizer, val_sentences):
    hub = tokenizer.as_keras_hub()
    expected = tokenizer.tokenize(val_sentences).to_list()
    # Eagerly, keras-hub runs the Python sentencepiece library and returns lists.
    assert hub(val_sentences) == expected
    # In a graph (tf.function, tf.data), it runs tensorflow-text ops.
    graph_ids = tf.function(hub)(tf.constant(val_sentences))
    assert graph_ids.to_list() == expected


def test_sampler_draws_other_segmentations_of_the_same_text(tokenizer, sentences, val_sentences):
    seen = set("".join(sentences))
    covered = [s for s in val_sentences if set(s) <= seen]
    best = tokenizer.tokenize(covered).to_list()
    submodules = tokenizer.submodules
    sample = tokenizer.sampler(0.3)
    assert tokenizer.submodules == submodules  # nothing new to export with the tokenizer
    first, second = sample(tf.constant(covered)), sample(tf.constant(covered))
    for ids in (first, second):
        assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32
        decoded = [s.decode("utf-8") for s in tokenizer.detokenize(ids).numpy()]
        assert decoded == [_normalized(s) for s in covered]
        assert sum(row != b for row, b in zip(ids.to_list(), best)) > 0.5 * len(covered)
    assert first.to_list() != second.to_list()
    # Sampling splits words more finely: smaller alpha, longer sequences.
    lengths = [
        int(tokenizer.sampler(alpha)(tf.constant(covered)).flat_values.shape[0])
        for alpha in (0.1, 1.0)
    ]
    assert lengths[0] > 1.2 * lengths[1]
    assert lengths[1] >= int(tf.size(tokenizer.tokenize(covered).flat_values))


@pytest.mark.parametrize("alpha", [0, 0.0, -0.5, 1.5, float("nan"), True, "0.5", None])
def test_sampler_rejects_bad_alpha(tokenizer, alpha):
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\]. Received: alpha="):
        tokenizer.sampler(alpha)


def test_training_is_deterministic(sentences, model_path, tmp_path):
    again = train_sentencepiece(sentences, tmp_path / "again.model", vocabulary_size=VOCAB_SIZE)
    assert again.read_bytes() == model_path.read_bytes()


def test_sampling_follows_the_seed(sentences, tmp_path):
    def train(seed: int, name: str) -> bytes:
        return train_sentencepiece(
            sentences, tmp_path / name, vocabulary_size=200, seed=seed, max_sentences=500
        ).read_bytes()

    assert train(1, "a.model") == train(1, "b.model")
    assert train(1, "a.model") != train(2, "c.model")


def test_bpe_model_type(sentences, tmp_path):
    tokenizer = Tokenizer(
        train_sentencepiece(
            sentences[:400], tmp_path / "bpe.model", vocabulary_size=300, model_type="bpe"
        )
    )
    assert tokenizer.vocabulary_size == 300
    assert tokenizer.detokenize(tokenizer.tokenize(["A red car."])).numpy().tolist() == [
        b"A red car."
    ]


def test_prepare_tokenizer_trains_the_model_type(sentences, tmp_path):
    """A run's tokenizer is the config's `tokenizer_type` (`training.run.prepare_tokenizer`)."""
    from sentencepiece import sentencepiece_model_pb2

    from keras_transformer.training.run import prepare_tokenizer

    pairs = list(zip(sentences[0:400:2], sentences[1:400:2]))
    for model_type in ("unigram", "bpe"):
        tokenizer = prepare_tokenizer(tmp_path / model_type, pairs, 300, model_type=model_type)
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(tokenizer.model_proto)
        assert proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.ModelType.Value(
            model_type.upper()
        )
        assert (tmp_path / model_type / "spm.model").is_file()


def test_too_large_vocab_names_requested_and_maximum(sentences, tmp_path):
    with pytest.raises(ValueError, match=r"vocabulary_size=50000 is too large .* maximum of \d+"):
        train_sentencepiece(sentences[:200], tmp_path / "big.model", vocabulary_size=50000)
    assert not (tmp_path / "big.model").exists()


def test_too_small_vocab(sentences, tmp_path):
    with pytest.raises(ValueError, match=r"vocabulary_size=10 is too small .* at least \d+"):
        train_sentencepiece(sentences[:200], tmp_path / "small.model", vocabulary_size=10)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"vocabulary_size": 4}, "vocabulary_size must be an int > 4"),
        ({"vocabulary_size": 100, "model_type": "wordpiece"}, "Unknown model_type 'wordpiece'"),
        ({"vocabulary_size": 100, "character_coverage": 0.0}, "character_coverage must be in"),
        (
            {"vocabulary_size": 100, "max_sentences": 0},
            "max_sentences must be a positive integer. Received: max_sentences=0",
        ),
    ],
)
def test_rejects_bad_arguments(tmp_path, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        train_sentencepiece(["a b c"], tmp_path / "x.model", **kwargs)


def test_rejects_empty_corpus(tmp_path):
    with pytest.raises(ValueError, match="No non-empty sentence"):
        train_sentencepiece(["", ""], tmp_path / "x.model", vocabulary_size=100)


def test_rejects_missing_and_invalid_models(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Tokenizer(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="Not a valid SentencePiece model: .*junk.model"):
        Tokenizer(junk)


def test_rejects_model_with_other_reserved_ids(sentences):
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences[:200]), model_writer=writer, vocab_size=100, minloglevel=2
    )
    with pytest.raises(ValueError, match="reserved ids .*'pad': -1"):
        Tokenizer(writer.getvalue())
