"""The Marian (OPUS-MT) tokenizer pair in our ids (`data.marian`), checked against `transformers`.

A Marian tokenizer directory is built here: two SentencePiece models trained as Marian's are
(source on English, target on German Multi30k lines; `<unk>` 0, `<s>` 1, `</s>` 2, no pad) and
a `vocab.json` of both models' pieces in an interleaved order, `</s>` first, `<pad>` last, with
two language codes; the separate-vocabulary variant has a `target_vocab.json` of its own.
"""

import gzip
import io
import json

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import transformers

from keras_transformer import runs
from keras_transformer.data.marian import (
    MarianFilesError,
    MarianTokenizer,
    marian_id_inverse,
    marian_id_map,
    marian_row_map,
    read_marian_files,
)
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.plan import BatchPlan
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from keras_transformer.decoding.text import encode_source

CRAFTED = [
    "",
    " ",
    "   A dog runs.   ",
    "\tA\tcat\nsleeps ",
    "12 345 6.789 0,5 2024",
    "ß straße Größe",
    "☃ snow ☃ ❄",
    "日本語のテキスト",
    "ﬁne ＡＢＣ ①",
    "e\u0301 café naïve",
    "▁x▁ ▁",
    "multiple     spaces    inside",
    ">>fr<< A dog",
    ">>de<<Ein Hund",
    ">>xx<< unknown code",
    ">>fr<<",
    ">> not a code",
    "😀😀 emoji",
    "x" * 60,
    "\u200b zero width",
    "ÄÖÜ äöü éèê",
]


def _lines(directory, name, start, stop):
    with gzip.open(directory / name, "rt", encoding="utf-8") as file:
        return [line.strip() for _, line in zip(range(stop), file)][start:]


def _marian_spm(sentences):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=300,
        character_coverage=0.98,  # some characters are unknown, as in OPUS-MT's models
        minloglevel=2,
        num_threads=1,
    )
    return model.getvalue()


def _pieces(proto):
    processor = spm.SentencePieceProcessor(model_proto=proto)
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def _vocabulary(*piece_lists):
    """Marian's layout: `</s>` 0, `<unk>` 1, language codes, the pieces interleaved, `<pad>` last."""
    vocabulary = {"</s>": 0, "<unk>": 1, ">>fr<<": 2, ">>de<<": 3}
    for pieces in zip(*piece_lists):
        for piece in pieces:
            vocabulary.setdefault(piece, len(vocabulary))
    vocabulary["<pad>"] = len(vocabulary)
    return vocabulary


def write_marian_tokenizer(directory, multi30k_dir, separate=False):
    """A Marian tokenizer directory (see the module docstring); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    source = _marian_spm(_lines(multi30k_dir, "train.en.gz", 0, 400))
    target = _marian_spm(_lines(multi30k_dir, "train.de.gz", 0, 400))
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    if separate:
        vocabularies = {
            "vocab.json": _vocabulary(_pieces(source)),
            "target_vocab.json": _vocabulary(list(reversed(_pieces(target)))),
        }
        (directory / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))
    else:
        vocabularies = {"vocab.json": _vocabulary(_pieces(target), _pieces(source))}
    for name, vocabulary in vocabularies.items():
        (directory / name).write_text(json.dumps(vocabulary, ensure_ascii=False))
    return directory


@pytest.fixture(scope="session", params=["shared", "separate"])
def marian_dir(request, multi30k_dir, tmp_path_factory):
    separate = request.param == "separate"
    return write_marian_tokenizer(
        tmp_path_factory.mktemp(f"marian_{request.param}"), multi30k_dir, separate=separate
    )


@pytest.fixture(scope="session")
def pair(marian_dir):
    """`(ours, theirs)`: our `MarianTokenizer` and `transformers.MarianTokenizer` of one directory."""
    return MarianTokenizer(marian_dir), transformers.MarianTokenizer.from_pretrained(
        str(marian_dir)
    )


@pytest.fixture(scope="session")
def sources(multi30k_dir):
    return CRAFTED + _lines(multi30k_dir, "val.en.gz", 0, 200)


@pytest.fixture(scope="session")
def targets(multi30k_dir):
    return CRAFTED + _lines(multi30k_dir, "val.de.gz", 0, 200)


def _ours(ids, id_map):
    return id_map[np.asarray(ids, dtype=np.int64)].tolist()


def _rows(ids):
    """Rows of a padded id array without their PAD ids."""
    return [[i for i in row if i != PAD_ID] for row in np.asarray(ids).tolist()]


# --- the id mapping ---


def test_id_map_sends_the_specials_to_ours_and_keeps_the_others_in_order():
    id_map = marian_id_map(8, pad_id=7, unk_id=1, eos_id=0)
    assert id_map.tolist() == [EOS_ID, UNK_ID, 4, 5, 6, 7, 8, PAD_ID]
    inverse = marian_id_inverse(id_map)
    assert len(inverse) == 9
    assert inverse[id_map].tolist() == list(range(8))  # the inverse of every Marian id
    assert inverse[BOS_ID] == 7  # the start row is Marian's pad
    rows = marian_row_map(id_map)
    assert rows.tolist() == [EOS_ID, UNK_ID, 4, 5, 6, 7, 8, BOS_ID]
    weights = np.arange(8.0)[:, None] * np.ones((1, 3))  # a Marian matrix, row m = m
    ours = weights[inverse]
    np.testing.assert_array_equal(ours[rows], weights)  # there and back


def test_id_map_with_specials_anywhere():
    id_map = marian_id_map(6, pad_id=0, unk_id=5, eos_id=2)
    assert id_map.tolist() == [PAD_ID, 4, EOS_ID, 5, 6, UNK_ID]


@pytest.mark.parametrize(
    "specials",
    [dict(pad_id=1, unk_id=1, eos_id=0), dict(pad_id=6, unk_id=1, eos_id=0)],
    ids=["repeated", "outside"],
)
def test_id_map_refuses_bad_special_ids(specials):
    with pytest.raises(ValueError, match="three distinct ids below vocabulary_size=6"):
        marian_id_map(6, **specials)


# --- reading the files ---


def _broken_copy(marian_dir, tmp_path, name, content):
    directory = tmp_path / "broken"
    directory.mkdir()
    for path in marian_dir.iterdir():
        if path.name != name:
            (directory / path.name).write_bytes(path.read_bytes())
    if content is not None:
        (directory / name).write_bytes(content)
    return directory


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("source.spm", None, "Missing Marian SentencePiece model: .*source.spm$"),
        ("target.spm", None, "Missing Marian SentencePiece model: .*target.spm$"),
        ("vocab.json", None, "Missing Marian vocabulary file: .*vocab.json$"),
        ("target.spm", b"not a model", "target.spm is not a SentencePiece model"),
        ("vocab.json", b"{", "vocab.json is not a JSON object of piece -> id"),
        ("vocab.json", b'["</s>"]', "vocab.json is not a JSON object of piece -> integer id"),
        ("vocab.json", b'{"</s>": 0, "<unk>": 1, "<pad>": 3}', "does not give each of the ids"),
        ("vocab.json", b'{"</s>": 0, "<unk>": 1, "a": 2}', "vocab.json lacks the special piece"),
        ("tokenizer_config.json", b"[]", "tokenizer_config.json is not a JSON object$"),
    ],
)
def test_a_missing_or_bad_file_is_one_line_naming_it(marian_dir, tmp_path, name, content, message):
    directory = _broken_copy(marian_dir, tmp_path, name, content)
    with pytest.raises(MarianFilesError, match=message) as error:
        read_marian_files(directory)
    assert "\n" not in str(error.value)
    with pytest.raises(MarianFilesError, match=message):  # the same through the run's loader
        runs.run_tokenizer(directory)


def test_separate_vocabularies_without_their_file(marian_dir, tmp_path):
    directory = _broken_copy(marian_dir, tmp_path, "target_vocab.json", None)
    (directory / "tokenizer_config.json").write_text('{"separate_vocabs": true}')
    with pytest.raises(MarianFilesError, match="Missing Marian vocabulary file: .*target_vocab"):
        read_marian_files(directory)


def test_contents_are_the_same_tokenizer(marian_dir, pair, tmp_path, targets):
    ours, _ = pair
    for name, data in ours.files.contents().items():
        (tmp_path / name).write_bytes(data)
    again = MarianTokenizer(tmp_path)
    theirs = transformers.MarianTokenizer.from_pretrained(str(tmp_path))
    assert again.files.separate_vocabularies == ours.files.separate_vocabularies
    assert again.files.source_vocabulary.pieces == ours.files.source_vocabulary.pieces
    assert again.files.target_vocabulary.pieces == ours.files.target_vocabulary.pieces
    assert theirs.separate_vocabs == ours.files.separate_vocabularies
    assert again.tokenize(targets).to_list() == ours.tokenize(targets).to_list()


# --- equal to transformers.MarianTokenizer ---


def test_source_ids_equal_transformers(pair, sources):
    """Source text through `encode_source` (what translate and the export run) gives
    `MarianTokenizer`'s input ids, `</s>` included, in our ids."""
    ours, theirs = pair
    id_map = ours.files.source_vocabulary.id_map()
    expected = [_ours(theirs(text)["input_ids"], id_map) for text in sources]
    assert _rows(encode_source(ours, sources, 1000)) == expected
    assert len(sources) > 200


def test_target_ids_equal_transformers(pair, targets):
    ours, theirs = pair
    id_map = ours.files.target_vocabulary.id_map()
    expected = [_ours(theirs(text_target=text)["input_ids"], id_map) for text in targets]
    assert [row + [EOS_ID] for row in ours.tokenize_target(targets).to_list()] == expected


def test_decoded_text_equals_transformers(pair, targets):
    """Our ids of their target ids decode to their `decode(skip_special_tokens=True)` with the
    target model; so do random ids, specials (`<unk>`, `<pad>`, codes) among them."""
    ours, theirs = pair
    id_map = ours.files.target_vocabulary.id_map()
    vocabulary = ours.files.target_vocabulary
    rng = np.random.default_rng(0)
    sequences = [theirs(text_target=text)["input_ids"] for text in targets]
    specials = [vocabulary.unk_id, vocabulary.pad_id, vocabulary.pieces.index(">>fr<<")]
    for _ in range(300):
        ids = rng.integers(0, vocabulary.size, size=rng.integers(0, 30)).tolist()
        ids = rng.permutation(ids + specials[: rng.integers(0, 4)]).tolist()
        sequences.append([int(i) for i in ids if i != vocabulary.eos_id])
    expected = [
        theirs.decode(ids, skip_special_tokens=True, use_source_tokenizer=False)
        for ids in sequences
    ]
    ragged = tf.ragged.constant([_ours(ids, id_map) for ids in sequences], dtype=tf.int32)
    assert [text.decode() for text in ours.detokenize(ragged).numpy()] == expected
    assert ours.detokenize(ragged[3]).numpy().decode() == expected[3]  # one sequence, rank 1


def test_special_pieces_written_in_the_text_are_text(pair):
    """Where ours differs on purpose: `transformers` reads "</s>" or "<unk>" in the input as the
    special itself, ours splits them as any text (a user's text cannot end a sentence early)."""
    ours, theirs = pair
    id_map = ours.files.source_vocabulary.id_map()
    text = "a </s> b"
    assert _ours(theirs(text)["input_ids"], id_map).count(EOS_ID) == 2
    assert _rows(encode_source(ours, [text], 100))[0].count(EOS_ID) == 1


def test_detokenize_cuts_at_the_first_eos_and_drops_our_start_id(pair, targets):
    ours, _ = pair
    ids = ours.tokenize_target(targets[30:32]).to_list()
    first, second = (ours.detokenize(tf.ragged.constant([row])).numpy()[0] for row in ids)
    joined = tf.constant([[BOS_ID, *ids[0], EOS_ID, *ids[1], PAD_ID]])
    assert ours.detokenize(joined).numpy()[0] == first
    assert first and second and first != second


def test_sizes_and_pieces(pair):
    ours, _ = pair
    files = ours.files
    assert ours.vocabulary_size == files.source_vocabulary.size + 1
    assert ours.target_vocabulary_size == files.target_vocabulary.size + 1
    assert ours.id_to_piece(EOS_ID) == "</s>" and ours.id_to_piece(PAD_ID) == "<pad>"
    assert ours.id_to_piece(BOS_ID) == "<s>"
    assert ours.id_to_piece(4) == files.source_vocabulary.pieces[2]  # the first non-special id
    assert ours.id_to_piece(4, target=True) == files.target_vocabulary.pieces[2]
    with pytest.raises(ValueError, match="out of range"):
        ours.id_to_piece(ours.vocabulary_size)


# --- in graphs ---


def test_graph_functions_and_tf_data_give_the_eager_ids(pair, sources, targets):
    ours, _ = pair

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        return ours.detokenize(ours.tokenize_target(texts).to_tensor())

    texts = targets[:50]
    eager = ours.detokenize(ours.tokenize_target(texts)).numpy().tolist()
    assert round_trip(tf.constant(texts)).numpy().tolist() == eager
    dataset = tf.data.Dataset.from_tensor_slices(sources[:50]).batch(16).map(ours.tokenize)
    assert [row for batch in dataset for row in batch.to_list()] == ours.tokenize(
        sources[:50]
    ).to_list()


class _Tokenizing(tf.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def __call__(self, texts):
        source = self.tokenizer.tokenize(texts)
        target = self.tokenizer.tokenize_target(texts)
        return {
            "source": source.to_tensor(),
            "target": target.to_tensor(),
            "text": self.tokenizer.detokenize(target),
        }


def test_a_saved_model_keeps_both_models_apart_and_has_servable_ops(pair, targets, tmp_path):
    """Saved and loaded, the module tokenizes each side with its own model as before (TensorFlow
    Text's default resource name would give both sides the source model); its ops are all
    TensorFlow core or SentencePiece."""
    from keras_transformer.export.ops_check import assert_servable_ops

    ours, _ = pair
    texts = tf.constant(targets[:60])
    module = _Tokenizing(ours)
    expected = module(texts)
    assert expected["source"].shape != expected["target"].shape  # the two models differ here
    tf.saved_model.save(module, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))(texts)
    for key, value in expected.items():
        assert loaded[key].numpy().tolist() == value.numpy().tolist(), key
    assert_servable_ops(tmp_path / "saved")


def test_sampler_draws_other_segmentations_of_each_side(pair, targets):
    ours, _ = pair
    texts = targets[40:80]
    for target, tokenize in ((False, ours.tokenize), (True, ours.tokenize_target)):
        sampled = ours.sampler(0.1, target=target)(tf.constant(texts)).to_list()
        assert sampled != tokenize(texts).to_list()
    sampled = ours.sampler(0.1, target=True)(tf.constant(texts))
    exact = ours.detokenize(ours.tokenize_target(texts)).numpy().tolist()
    assert ours.detokenize(sampled).numpy().tolist() == exact


# --- a run's tokenizer ---


def test_run_tokenizer_reads_the_pair_or_spm_model(marian_dir, tmp_path, multi30k_dir):
    assert isinstance(runs.run_tokenizer(marian_dir), MarianTokenizer)
    assert runs.has_marian_tokenizer(marian_dir)
    with pytest.raises(FileNotFoundError, match="No tokenizer at .*spm.model"):
        runs.run_tokenizer(tmp_path)
    from keras_transformer.data.tokenizer import train_sentencepiece

    train_sentencepiece(_lines(multi30k_dir, "val.en.gz", 0, 200), tmp_path / "spm.model", 64)
    assert type(runs.run_tokenizer(tmp_path)) is Tokenizer
    assert not runs.has_marian_tokenizer(tmp_path)


@pytest.mark.parametrize("batches", ["make_dataset", "BatchPlan"])
def test_training_batches_split_each_side_with_its_model(pair, sources, targets, batches):
    """The training data (`make_dataset`, `BatchPlan`): sources with `source.spm` + `</s>`,
    decoder inputs `<s>` + targets with `target.spm`, labels targets + `</s>`."""
    ours, theirs = pair
    source_map = ours.files.source_vocabulary.id_map()
    target_map = ours.files.target_vocabulary.id_map()
    pairs = list(zip(sources[21:81], targets[21:81]))  # parallel validation lines
    if batches == "make_dataset":
        dataset = make_dataset(pairs, ours, batch_tokens=4096, max_length=128, shuffle=False)
    else:
        plan = BatchPlan(pairs, ours, batch_tokens=4096, max_length=128)
        dataset = plan.dataset(start=0).take(plan.batches_per_epoch)
    found = {}
    for inputs, labels in dataset:
        for source, target_in, label in zip(
            _rows(inputs["source_ids"]), _rows(inputs["target_ids"]), _rows(labels)
        ):
            found[tuple(source)] = (target_in, label)
    assert len(found) == len(pairs)
    for source, target in pairs:
        target_ids = _ours(theirs(text_target=target)["input_ids"], target_map)
        target_in, label = found[tuple(_ours(theirs(source)["input_ids"], source_map))]
        assert label == target_ids
        assert target_in == [BOS_ID, *target_ids[:-1]]


# --- a run holding the pair, exported for TF Serving (slow tier) ---


@pytest.fixture(scope="session")
def marian_run(multi30k_dir, tmp_path_factory):
    """A run directory with the shared-vocabulary pair instead of `spm.model` and a
    random-initialised tiny Transformer of its vocabulary size as `checkpoints/ckpt-0`."""
    from keras_transformer.models.config import get_preset
    from keras_transformer.models.transformer import build_model
    from keras_transformer.pretrained import write_weights_checkpoint
    from keras_transformer.training import TrainOptions
    from keras_transformer.training.trainer import write_run_config

    run = write_marian_tokenizer(tmp_path_factory.mktemp("marian_run"), multi30k_dir)
    config = get_preset(
        "tiny",
        vocabulary_size=MarianTokenizer(run).vocabulary_size,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=32,
        intermediate_dim=64,
        num_heads=2,
        max_length=32,
    )
    write_run_config(run, config, TrainOptions())
    write_weights_checkpoint(build_model(config), run)
    return run


def test_export_of_a_run_with_the_pair_answers_text_in_a_clean_runtime(marian_run, tmp_path):
    """`experiments/export.py` on the run: the pair's files are the export's assets, its ops pass
    the check, and in a TensorFlow-only process of the released serving runtime `translate` and
    `score` answer as the run's `TranslationModule` does in Python; `translate`'s text is the
    pair's decoding of `translate_ids`' ids."""
    from keras_transformer.export.translator import TranslationModule
    from tests import runtimes
    from tests.scripts import run_script
    from tests.test_export import call_signature_in_runtime

    texts = ["A dog runs in the park.", "", "ß ☃ 12", ">>fr<< Two men."]
    targets = ["Ein Hund.", "", "Zwei Männer ß.", "x"]
    result = run_script(
        "export.py",
        f"--model_dir={marian_run}",
        f"--export_dir={tmp_path}",
        "--name=marian",
        "--beam_size=2",
        "--max_output_offset=8",
        f"--sample={texts[0]}",
    )
    assert "all TensorFlow core or TensorFlow Text (SentencePiece)" in result.stdout
    version = tmp_path / "marian" / "1"
    info = json.loads((version / "assets.extra" / "export_info.json").read_text())
    assert info["tokenizer_assets"] == [
        f"assets/{name}"
        for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
    ]
    for name in ("source.spm", "target.spm"):
        assert (version / "assets" / name).read_bytes() == (marian_run / name).read_bytes()
    theirs = transformers.MarianTokenizer.from_pretrained(str(version / "assets"))
    mine = transformers.MarianTokenizer.from_pretrained(str(marian_run))
    assert [theirs(t)["input_ids"] for t in texts] == [mine(t)["input_ids"] for t in texts]

    translator = TranslationModule.from_run(marian_run, beam_size=2, max_output_offset=8)
    expected = translator.translate(tf.constant(texts))
    ids = translator.translate_ids(translator.encode(tf.constant(texts)))["token_ids"]
    assert expected["translation"].numpy().tolist() == [
        text for text in translator.tokenizer.detokenize(ids).numpy().tolist()
    ]
    assert any(expected["translation"].numpy())  # a random model still writes some pieces
    score = translator.score(tf.constant(texts), tf.constant(targets))["log_probability"]

    python, _, _ = runtimes.runtime_python(runtimes.DEFAULT_RUNTIMES[0])
    served = call_signature_in_runtime(
        python, version, "translate", runtimes.DEFAULT_RUNTIMES[0], text=texts
    )
    assert served["translation"] == [t.decode() for t in expected["translation"].numpy()]
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), atol=1e-4)
    served = call_signature_in_runtime(python, version, "score", source=texts, target=targets)
    np.testing.assert_allclose(served["log_probability"], score.numpy(), atol=1e-4)

    # translate.py reads the same run through runs.run_tokenizer and prints the same texts.
    printed = run_script(
        "translate.py",
        f"--model_dir={marian_run}",
        "--beam_size=2",
        "--max_output_offset=8",
        stdin="".join(f"{text}\n" for text in texts if text),
    ).stdout.splitlines()
    assert printed == [
        text.decode() for text, source in zip(expected["translation"].numpy(), texts) if source
    ]


def test_score_splits_targets_with_the_target_model(marian_run):
    """The export's `score` (the forced-decoding log-probability): the target is `transformers`'
    target ids (`</s>` included) after `<s>`, the source its input ids."""
    from keras_transformer.export.translator import TranslationModule

    translator = TranslationModule.from_run(marian_run, beam_size=2, max_output_offset=8)
    theirs = transformers.MarianTokenizer.from_pretrained(str(marian_run))
    id_map = translator.tokenizer.files.source_vocabulary.id_map()
    sources, targets = ["A dog runs.", "Two men"], ["Ein Hund läuft.", "Zwei Männer sitzen"]
    found = translator.score(tf.constant(sources), tf.constant(targets))["log_probability"]
    model = translator.model
    for source, target, score in zip(sources, targets, found.numpy()):
        source_ids = tf.constant([_ours(theirs(source)["input_ids"], id_map)])
        labels = _ours(theirs(text_target=target)["input_ids"], id_map)
        encoded, mask = model.encode(source_ids)
        logits = model.decode(tf.constant([[BOS_ID, *labels[:-1]]]), encoded, mask)[0]
        log_probs = tf.nn.log_softmax(logits, axis=-1).numpy()
        assert score == pytest.approx(sum(log_probs[i, t] for i, t in enumerate(labels)), abs=1e-4)


def test_attention_maps_show_each_side_in_its_pieces(marian_run):
    from keras_transformer.visualization.attention import attention_maps

    model, tokenizer, _ = runs.load_run(marian_run)
    theirs = transformers.MarianTokenizer.from_pretrained(str(marian_run))
    source, target = "A dog runs.", "Ein Hund läuft."
    maps = attention_maps(model, tokenizer, source, target=target)
    assert maps.source_pieces == theirs.convert_ids_to_tokens(theirs(source)["input_ids"])
    assert maps.target_pieces == theirs.convert_ids_to_tokens(
        theirs(text_target=target)["input_ids"]
    )
