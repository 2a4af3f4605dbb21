"""OPUS-MT (Marian) checkpoints: read into our model equal to `transformers`' own, and back.

A tiny random `MarianMTModel` (every weight drawn at random, the final-logits bias too)
with a locally trained pair of SentencePiece models and a `vocab.json` whose `<pad>` is the
last id, saved with `save_pretrained`: no download.
"""

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_transformer import pretrained  # noqa: E402
from keras_transformer.data.marian import (  # noqa: E402
    marian_id_inverse,
    marian_row_map,
    read_marian_files,
)
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID  # noqa: E402
from keras_transformer.decoding import beam_search, greedy_search  # noqa: E402

SENTENCES = 400  # Multi30k lines the SentencePiece models learn from
OUTPUT_LENGTH = 12  # tokens generated, by both searches
EOS_BIAS = 1.5  # added to </s>'s final-logits bias: some outputs end, some reach the limit
EMBEDDING_STD = 0.2


def _train_spm(sentences, prefix, size=120):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(prefix),
        vocab_size=size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def _pieces(model_file):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def write_marian_directory(
    directory,
    multi30k_dir,
    seed=0,
    eos_bias=EOS_BIAS,
    embedding_std=EMBEDDING_STD,
    separate=False,
    **config,
):
    """A random Marian model of `config` (MarianConfig fields) and its tokenizer in `directory`;
    `separate`: a source and a target vocabulary (`target_vocab.json`, `<pad>` at id 2 in both)."""
    from keras_transformer.data.corpus import load_multi30k

    pairs = load_multi30k("en", "de", "train", data_dir=multi30k_dir)[:SENTENCES]
    work = directory / "spm"
    work.mkdir(parents=True)
    source = _train_spm([pair[0] for pair in pairs], work / "source")
    target = _train_spm([pair[1] for pair in pairs], work / "target", 100 if separate else 120)
    pieces = sorted(set(_pieces(source)) | set(_pieces(target)))
    vocabulary = {piece: i for i, piece in enumerate(["</s>", "<unk>", *pieces, "<pad>"])}
    shutil.copy(source, directory / "source.spm")
    shutil.copy(target, directory / "target.spm")
    (directory / "vocab.json").write_text(json.dumps(vocabulary))
    files = {}
    if separate:
        for name, model_file in (("vocab.json", source), ("target_vocab.json", target)):
            side = ["</s>", "<unk>", "<pad>", *sorted(_pieces(model_file))]
            (directory / name).write_text(json.dumps({piece: i for i, piece in enumerate(side)}))
        vocabulary = json.loads((directory / "vocab.json").read_text())
        target_size = len(json.loads((directory / "target_vocab.json").read_text()))
        config = dict(
            share_encoder_decoder_embeddings=False, decoder_vocab_size=target_size, **config
        )
        files = dict(target_vocab_file=str(directory / "target_vocab.json"), separate_vocabs=True)
    pad = vocabulary["<pad>"]
    settings = dict(
        vocab_size=len(vocabulary),
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        activation_function="swish",
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=None,
        bad_words_ids=[[pad]],
    )
    settings.update(config)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**settings))
    with torch.no_grad():  # every weight random: a mapping that moves one shows
        for name, parameter in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
            elif name.endswith("layer_norm.bias"):
                parameter.copy_(0.1 * torch.randn_like(parameter))
            elif name == "model.shared.weight" or name.endswith("embed_tokens.weight"):
                parameter.copy_(embedding_std * torch.randn_like(parameter))
            else:
                parameter.copy_(0.2 * torch.randn_like(parameter))
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
        model.final_logits_bias[0, 0] += eos_bias  # </s>: some outputs end, some reach the limit
    tokenizer = transformers.MarianTokenizer(
        str(directory / "source.spm"),
        str(directory / "target.spm"),
        str(directory / "vocab.json"),
        **files,
    )
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    shutil.rmtree(work)
    return directory


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory, multi30k_dir):
    return write_marian_directory(tmp_path_factory.mktemp("marian"), multi30k_dir)


@pytest.fixture(scope="session")
def marian(marian_dir):
    """`(their model, their tokenizer, our model, our config, the tokenizer files)`."""
    theirs = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(marian_dir))
    ours, config, files, _ = pretrained.read_marian(marian_dir)
    return theirs, tokenizer, ours, config, files


SOURCES = [
    "A man in an orange hat starring at something.",
    "Two dogs play.",
    "A little girl climbing into a wooden playhouse while her mother watches from the side.",
]
TARGETS = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei Hunde spielen.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
]


def _batch(tokenizer, id_map, target_map=None):
    """Their padded batch (ids, mask, decoder inputs, the decoder's real positions) and ours."""
    batch = tokenizer(SOURCES, text_target=TARGETS, return_tensors="pt", padding=True)
    pad = tokenizer.pad_token_id
    labels = batch["labels"]
    decoder_ids = torch.cat([torch.full_like(labels[:, :1], pad), labels[:, :-1]], dim=1)
    real = (decoder_ids != pad).numpy()
    real[:, 0] = True  # the start token
    source_ids = id_map[batch["input_ids"].numpy()]
    target_map = id_map if target_map is None else target_map
    target_ids = np.where(real, target_map[decoder_ids.numpy()], 0)
    target_ids[:, 0] = BOS_ID
    return batch, decoder_ids, real, source_ids, target_ids


def _their_logits(theirs, batch, decoder_ids):
    with torch.no_grad():
        return theirs(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_ids,
        ).logits.numpy()


def test_logits_equal_transformers_on_a_padded_batch(marian):
    theirs, tokenizer, ours, config, files = marian
    id_map = files.source_vocabulary.id_map()
    batch, decoder_ids, real, source_ids, target_ids = _batch(tokenizer, id_map)
    assert (batch["attention_mask"].numpy() == 0).any() and not real.all()  # padding on both sides
    expected = _their_logits(theirs, batch, decoder_ids)  # (B, T, V) in Marian's ids
    logits = np.asarray(ours({"source_ids": source_ids, "target_ids": target_ids}))  # (B, T, V + 1)
    assert logits.shape[-1] == expected.shape[-1] + 1 == config.vocabulary_size
    # Every one of our columns is Marian's column of the same token; BOS's is pad's.
    inverse = marian_id_inverse(id_map)
    difference = np.abs(logits[real] - expected[real][:, inverse])
    assert difference.max() <= 1e-4, difference.max()


def test_layer_norms_follow_marians_epsilon(marian):
    """On inputs of variance ~1e-6, where the epsilon decides the output, our layer norms give
    Marian's (the logits above barely depend on it at this model's scale)."""
    theirs, _, ours, _, _ = marian
    pairs = [
        (
            "encoder_layer_0/self_attention_layer_norm",
            theirs.model.encoder.layers[0].self_attn_layer_norm,
        ),
        (
            "decoder_layer_0/feed_forward_layer_norm",
            theirs.model.decoder.layers[0].final_layer_norm,
        ),
    ]
    layers = {layer.path: layer for layer in ours._flatten_layers() if hasattr(layer, "path")}
    inputs = 1e-3 * np.random.default_rng(0).standard_normal((2, 3, ours.config.hidden_dim))
    for path, their_layer in pairs:
        with torch.no_grad():
            expected = their_layer(torch.tensor(inputs, dtype=torch.float32)).numpy()
        actual = np.asarray(layers[path](inputs.astype("float32")))
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4)


def _their_outputs(theirs, tokenizer, id_map, **settings):
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = theirs.generate(
            **batch,
            max_new_tokens=OUTPUT_LENGTH,
            do_sample=False,
            early_stopping=False,
            forced_eos_token_id=None,
            **settings,
        ).numpy()
    outputs = []
    for row in generated[:, 1:]:  # without the start token
        row = list(row)
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        outputs.append([int(id_map[token]) for token in row])
    return outputs, id_map[batch["input_ids"].numpy()]


def _our_outputs(token_ids):
    outputs = []
    for row in np.asarray(token_ids).tolist():
        row = [token for token in row if token != 0]
        if EOS_ID in row:
            row = row[: row.index(EOS_ID) + 1]
        outputs.append(row)
    return outputs


def test_greedy_search_returns_their_generate_ids(marian):
    theirs, tokenizer, ours, _, files = marian
    id_map = files.source_vocabulary.id_map()
    expected, source_ids = _their_outputs(theirs, tokenizer, id_map, num_beams=1)
    token_ids, _ = greedy_search(ours, source_ids, max_length=OUTPUT_LENGTH)
    assert _our_outputs(token_ids) == expected
    ends = [row[-1] == EOS_ID for row in expected]
    assert any(ends) and not all(ends)  # ended by EOS and cut at the limit, both


def test_beam_search_returns_their_generate_ids(marian):
    """Beam 4 at length penalty 0 on both sides: transformers divides a finished hypothesis's
    log-probability by |Y|^alpha, ours by ((5 + |Y|) / 6)^alpha (docs/pretrained.md)."""
    theirs, tokenizer, ours, _, files = marian
    id_map = files.source_vocabulary.id_map()
    expected, source_ids = _their_outputs(
        theirs, tokenizer, id_map, num_beams=4, length_penalty=0.0
    )
    token_ids, _ = beam_search(
        ours, source_ids, beam_size=4, length_penalty=0.0, max_length=OUTPUT_LENGTH
    )  # (B, 1, L)
    assert _our_outputs(np.asarray(token_ids)[:, 0]) == expected
    greedy = _their_outputs(theirs, tokenizer, id_map, num_beams=1)[0]
    assert expected != greedy  # the beam found other outputs than greedy search


# --- back to transformers ---


@pytest.fixture(scope="session")
def imported_run(marian_dir, tmp_path_factory):
    """`import_marian` of `marian_dir`; treat it as read-only."""
    return pretrained.import_marian(marian_dir, tmp_path_factory.mktemp("imported") / "run")


def test_export_loads_in_transformers_with_our_logits(marian, imported_run, tmp_path):
    """A run whose weights moved (as fine-tuning moves them, the start row too) comes back as a
    MarianMTModel and MarianTokenizer with our logits; its start row is our BOS row."""
    from keras_transformer.runs import load_run

    _, tokenizer, _, _, files = marian
    run = tmp_path / "run"
    shutil.copytree(imported_run, run)
    model, _, config = load_run(run)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(variable.numpy() + 0.1 * rng.standard_normal(variable.shape))
    pretrained.write_weights_checkpoint(model, run, step=1)
    exported = pretrained.export_marian(run, tmp_path / "exported")
    theirs = transformers.MarianMTModel.from_pretrained(str(exported)).eval()
    their_tokenizer = transformers.MarianTokenizer.from_pretrained(str(exported))
    assert their_tokenizer(SOURCES)["input_ids"] == tokenizer(SOURCES)["input_ids"]
    id_map = files.source_vocabulary.id_map()
    batch, decoder_ids, real, source_ids, target_ids = _batch(their_tokenizer, id_map)
    expected = _their_logits(theirs, batch, decoder_ids)
    logits = np.asarray(model({"source_ids": source_ids, "target_ids": target_ids}))
    # Marian's pad column is our BOS row's (`marian_row_map`); our PAD row is not exported.
    difference = np.abs(logits[real][:, marian_row_map(id_map)] - expected[real])
    assert difference.max() <= 1e-4, difference.max()


@pytest.mark.parametrize(
    "field, value",
    [("sinusoid_layout", "interleaved"), ("normalize_first", True), ("final_logits_bias", False)],
)
def test_export_refuses_what_marian_cannot_express(imported_run, tmp_path, field, value):
    from keras_transformer import runs

    config, payload = runs.read_run_config(imported_run)
    runs.write_run_config(
        tmp_path, {**payload, "model": config.replace(**{field: value}).to_dict()}
    )
    with pytest.raises(pretrained.MarianFormatError) as error:
        pretrained.export_marian(tmp_path, tmp_path / "exported")
    assert f"{field}={value!r}" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "exported").exists()


def test_export_refuses_a_run_without_a_marian_tokenizer(imported_run, tmp_path):
    from keras_transformer import runs

    _, payload = runs.read_run_config(imported_run)
    runs.write_run_config(tmp_path, payload)
    (tmp_path / "spm.model").write_bytes((imported_run / "source.spm").read_bytes())
    with pytest.raises(
        pretrained.MarianFormatError, match="its tokenizer is spm.model, not a Marian pair"
    ):
        pretrained.export_marian(tmp_path, tmp_path / "exported")


# --- what an import refuses, in one line ---


def _broken_copy(marian_dir, tmp_path, config=None, remove=()):
    copy = tmp_path / "marian"
    shutil.copytree(marian_dir, copy)
    if config:
        path = copy / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    for name in remove:
        (copy / name).unlink()
    return copy


@pytest.mark.parametrize(
    "config, remove, message",
    [
        ({"normalize_before": True}, (), "normalize_before=True is not supported"),
        ({"scale_embedding": False}, (), "scale_embedding=False is not supported"),
        ({"activation_function": "gelu"}, (), "activation_function='gelu' is not supported"),
        (
            {"decoder_attention_heads": 4},
            (),
            "decoder_attention_heads=4 is not supported: it differs",
        ),
        ({"decoder_ffn_dim": 64}, (), "decoder_ffn_dim=64 is not supported: it differs"),
        ({"share_encoder_decoder_embeddings": False}, (), "share_encoder_decoder_embeddings=False"),
        ({"model_type": "bart"}, (), "model_type='bart', expected 'marian'"),
        (
            {"encoder_ffn_dim": 64, "decoder_ffn_dim": 64},
            (),
            "model.encoder.layers.0.fc1.weight has shape (32, 16), config.json says (64, 16)",
        ),
        ({"encoder_layers": 3}, (), "has no weight model.encoder.layers.2.self_attn.q_proj.weight"),
        ({"vocab_size": 100, "decoder_vocab_size": 100}, (), "vocab_size=100 disagrees with"),
        (None, ("source.spm",), "Missing Marian SentencePiece model: "),
        (None, ("vocab.json",), "Missing Marian vocabulary file: "),
        (
            None,
            ("model.safetensors",),
            "has no weights: expected model.safetensors or pytorch_model.bin",
        ),
        (None, ("config.json",), "is not a Marian checkpoint: it has no config.json"),
    ],
)
def test_import_refuses_in_one_line(marian_dir, tmp_path, config, remove, message):
    source = _broken_copy(marian_dir, tmp_path, config, remove)
    with pytest.raises(ValueError) as error:
        pretrained.import_marian(source, tmp_path / "run")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_import_reads_pytorch_weights_as_safetensors(marian_dir, tmp_path):
    """`pytorch_model.bin` (torch.load, weights_only) gives the weights model.safetensors gives."""
    from safetensors.torch import load_file

    source = _broken_copy(marian_dir, tmp_path, remove=("model.safetensors",))
    torch.save(load_file(str(marian_dir / "model.safetensors")), source / "pytorch_model.bin")
    weights, path = pretrained.read_marian_weights(source)
    expected, _ = pretrained.read_marian_weights(marian_dir)
    assert path.endswith("pytorch_model.bin") and sorted(weights) == sorted(expected)
    assert all(np.array_equal(weights[name], expected[name]) for name in expected)


def test_import_refuses_a_directory_that_holds_a_run(marian_dir, imported_run):
    with pytest.raises(pretrained.MarianFormatError, match="already holds a run"):
        pretrained.import_marian(marian_dir, imported_run)


@pytest.fixture(scope="session")
def separate_dir(tmp_path_factory, multi30k_dir):
    return write_marian_directory(tmp_path_factory.mktemp("separate"), multi30k_dir, separate=True)


def test_separate_vocabularies_logits_and_export(separate_dir, tmp_path):
    """A source and a target vocabulary of their own (`target_vocab.json`): our source embedding
    in the source's ids, the target embedding and the logits in the target's; and back."""
    theirs = transformers.MarianMTModel.from_pretrained(str(separate_dir)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(separate_dir))
    run = pretrained.import_marian(separate_dir, tmp_path / "run")
    from keras_transformer.runs import load_run

    ours, _, config = load_run(run)
    assert not config.share_embeddings
    assert config.vocabulary_size != config.decoder_vocabulary_size
    files = read_marian_files(separate_dir)
    source_map, target_map = files.source_vocabulary.id_map(), files.target_vocabulary.id_map()
    batch, decoder_ids, real, source_ids, target_ids = _batch(tokenizer, source_map, target_map)
    expected = _their_logits(theirs, batch, decoder_ids)
    logits = np.asarray(ours({"source_ids": source_ids, "target_ids": target_ids}))
    inverse = marian_id_inverse(target_map)
    assert np.abs(logits[real] - expected[real][:, inverse]).max() <= 1e-4
    exported = pretrained.export_marian(run, tmp_path / "exported")
    back = transformers.MarianMTModel.from_pretrained(str(exported)).eval()
    assert (
        transformers.MarianTokenizer.from_pretrained(str(exported))(SOURCES)["input_ids"]
        == (tokenizer(SOURCES)["input_ids"])
    )
    again = _their_logits(back, batch, decoder_ids)
    assert np.abs(again - expected).max() <= 1e-5
