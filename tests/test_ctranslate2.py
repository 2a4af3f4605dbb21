"""The CTranslate2 export: the same translations and log-probabilities as our own search.

Runs on the `trained_run` fixture (the default task) and 200 sentences of its test split.
"""

import json
import math

import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip("ctranslate2")

from keras_transformer.data.sources import load_pairs  # noqa: E402
from keras_transformer.decoding import beam_search, greedy_search  # noqa: E402
from keras_transformer.decoding.text import encode_source  # noqa: E402
from keras_transformer.evaluation.bleu import corpus_bleu  # noqa: E402
from keras_transformer.export.ctranslate2 import (  # noqa: E402
    check_ctranslate2_config,
    export_ctranslate2,
    save_ctranslate2,
    sinusoid_table,
    translate_ctranslate2,
    vocabulary,
)
from keras_transformer.models.config import get_preset  # noqa: E402
from keras_transformer.models.transformer import Transformer  # noqa: E402
from keras_transformer.runs import load_run  # noqa: E402
from tests.scripts import assign_random_weights, run_script  # noqa: E402

NUM_SENTENCES = 200
MAX_OUTPUT_OFFSET = 50
MIN_AGREEMENT = 0.99
LOG_PROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def ct2_models(trained_run, tmp_path_factory):
    """`{"float32": dir, "int8": dir}` exported from the trained run."""
    root = tmp_path_factory.mktemp("ctranslate2")
    return {
        kind: export_ctranslate2(trained_run, root / kind, quantization=kind)
        for kind in ("float32", "int8")
    }


@pytest.fixture(scope="module")
def sentences_and_model(trained_run):
    model, tokenizer, config = load_run(trained_run)
    texts = [source for source, _ in load_pairs("builtin", "test")[:NUM_SENTENCES]]
    return texts, model, tokenizer, config


def _our_outputs(token_ids):
    """Rows of a `(B, L)` search output as lists: up to and including EOS, no padding."""
    outputs = []
    for row in np.asarray(token_ids).tolist():
        outputs.append(row[: row.index(3) + 1] if 3 in row else [token for token in row if token])
    return outputs


def _compare(texts, model, tokenizer, config, model_dir, beam_size, compute_type="default"):
    source_ids = encode_source(tokenizer, texts, config.max_length)
    if beam_size == 1:
        token_ids, scores = greedy_search(model, source_ids, max_output_offset=MAX_OUTPUT_OFFSET)
    else:
        token_ids, scores = beam_search(
            model,
            source_ids,
            beam_size=beam_size,
            length_penalty=0.0,
            max_output_offset=MAX_OUTPUT_OFFSET,
        )
        token_ids, scores = token_ids[:, 0], scores[:, 0]
    ours = _our_outputs(token_ids)
    translator = ctranslate2.Translator(
        str(model_dir), device="cpu", compute_type=compute_type, intra_threads=1
    )
    theirs, their_scores = translate_ctranslate2(
        translator,
        tokenizer,
        texts,
        beam_size=beam_size,
        length_penalty=0.0,
        max_output_offset=MAX_OUTPUT_OFFSET,
        max_source_length=config.max_length,
    )
    equal = [a == b for a, b in zip(ours, theirs)]
    differences = [
        abs(float(a) - b) for a, b, same in zip(np.asarray(scores), their_scores, equal) if same
    ]
    return sum(equal) / len(equal), max(differences, default=math.inf)


@pytest.mark.parametrize("beam_size", [1, 4], ids=["greedy", "beam4"])
def test_float32_translations_and_log_probs_equal_ours(sentences_and_model, ct2_models, beam_size):
    agreement, max_difference = _compare(*sentences_and_model, ct2_models["float32"], beam_size)
    print(
        f"beam {beam_size}: {agreement:.1%} equal, max |log-prob difference| {max_difference:.2e}"
    )
    assert agreement >= MIN_AGREEMENT
    assert max_difference <= LOG_PROB_TOLERANCE


def test_int8_export_is_quantized_and_keeps_bleu(sentences_and_model, ct2_models):
    """int8 weights: a smaller model.bin, and BLEU within 4 points of float32 on the references.

    (The 120-step model is unsure of many tokens, so int8 changes about a third of its beam
    outputs; their quality, not their identity, is what quantization must keep. The run
    trained on planned batches loses 3.3 points, 74.7 -> 71.4; the one trained on the
    streamed input lost under 2.)
    """
    texts, _, tokenizer, config = sentences_and_model
    references = [target for _, target in load_pairs("builtin", "test")[:NUM_SENTENCES]]
    float32_size = (ct2_models["float32"] / "model.bin").stat().st_size
    int8_size = (ct2_models["int8"] / "model.bin").stat().st_size
    assert int8_size < 0.5 * float32_size
    bleu = {}
    for kind, model_dir in ct2_models.items():
        translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
        outputs, _ = translate_ctranslate2(
            translator, tokenizer, texts, max_source_length=config.max_length
        )
        hypotheses = [
            text.decode("utf-8")
            for text in tokenizer.detokenize(tf.ragged.constant(outputs)).numpy()
        ]
        bleu[kind] = corpus_bleu(hypotheses, references, tokenize="char")[0]
    print(f"BLEU float32 {bleu['float32']:.2f}, int8 {bleu['int8']:.2f}")
    assert bleu["float32"] > 50  # the trained run translates
    assert bleu["int8"] >= bleu["float32"] - 4.0


def test_directory_holds_vocabulary_and_sentencepiece_model(
    trained_run, sentences_and_model, ct2_models
):
    _, _, tokenizer, config = sentences_and_model
    for model_dir in ct2_models.values():
        assert (model_dir / "spm.model").read_bytes() == (trained_run / "spm.model").read_bytes()
        assert json.loads((model_dir / "shared_vocabulary.json").read_text()) == vocabulary(
            tokenizer
        )
        ct2_config = json.loads((model_dir / "config.json").read_text())
        assert ct2_config["add_source_eos"] is True
        assert ct2_config["decoder_start_token"] == "<s>"
        assert ct2_config["layer_norm_epsilon"] == pytest.approx(config.layer_norm_epsilon)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(normalize_first=True),
        dict(positional="learned"),
        dict(share_embeddings=False, tie_output=False),
        dict(activation="gelu", layer_norm_epsilon=0.5),  # an epsilon large enough to matter
        # OPUS-MT's (Marian's) options: sin || cos positions, SiLU, a final-logits bias
        dict(
            sinusoid_layout="concatenated",
            activation="silu",
            final_logits_bias=True,
            layer_norm_epsilon=1e-5,
        ),
        # a decoder vocabulary of its own, tied to the output projection or not, with the bias
        dict(share_embeddings=False, target_vocabulary_size=29, final_logits_bias=True),
        dict(
            share_embeddings=False,
            tie_output=False,
            target_vocabulary_size=29,
            final_logits_bias=True,
        ),
    ],
    ids=[
        "post_ln",
        "pre_ln",
        "learned_positions",
        "untied",
        "gelu_eps",
        "marian",
        "target_vocabulary",
        "target_vocabulary_untied",
    ],
)
def test_variants_score_like_ours(overrides, tmp_path):
    """Every supported setting: CTranslate2's teacher-forced token log-probabilities equal
    ours (float32) for a model whose every weight is random (no zero bias, no unit norm)."""
    config = get_preset(
        "tiny",
        vocabulary_size=40,
        num_encoder_layers=2,
        num_decoder_layers=2,
        hidden_dim=32,
        intermediate_dim=48,
        num_heads=4,
        max_length=24,
        **overrides,
    )
    model = Transformer(config, dtype="float32")
    assign_random_weights(model)
    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, 40)]
    target_size = config.decoder_vocabulary_size
    target_pieces = None
    if config.target_vocabulary_size is not None:
        target_pieces = pieces[:4] + [f"u{i}" for i in range(4, target_size)]
    translator = ctranslate2.Translator(
        str(save_ctranslate2(model, pieces, tmp_path / "model", target_pieces=target_pieces)),
        device="cpu",
    )
    rng = np.random.default_rng(1)
    sources = [rng.integers(4, 40, size=n).tolist() for n in (3, 9, 20)]
    targets = [rng.integers(4, target_size, size=n).tolist() for n in (5, 1, 17)]
    results = translator.score_batch(
        [[pieces[i] for i in source] for source in sources],
        [[(target_pieces or pieces)[i] for i in target] for target in targets],
    )
    for source, target, result in zip(sources, targets, results):
        encoder_outputs, mask = model.encode(np.array([source + [3]]))
        logits = model.decode(np.array([[2] + target]), encoder_outputs, mask)  # (1, T + 1, V)
        log_probs = np.asarray(tf.nn.log_softmax(logits, axis=-1))[0]
        ours = log_probs[np.arange(len(target) + 1), target + [3]]  # the targets, then EOS
        np.testing.assert_allclose(result.log_probs, ours, atol=1e-4)


def test_averaged_checkpoints_export_scores_like_the_averaged_model(
    trained_run, sentences_and_model, tmp_path
):
    texts, _, tokenizer, config = sentences_and_model
    model, _, _ = load_run(trained_run, average_last=2)
    model_dir = export_ctranslate2(trained_run, tmp_path / "averaged", average_last=2)
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    source_ids = encode_source(tokenizer, texts[:8], config.max_length)
    token_ids, scores = greedy_search(model, source_ids, max_output_offset=MAX_OUTPUT_OFFSET)
    outputs = _our_outputs(token_ids)
    results = translator.score_batch(
        [
            [tokenizer.id_to_piece(i) for i in row if i][:-1]
            for row in np.asarray(source_ids).tolist()
        ],
        [
            [tokenizer.id_to_piece(i) for i in output[:-1]] for output in outputs
        ],  # all end with EOS here
    )
    assert all(output[-1] == 3 for output in outputs)
    np.testing.assert_allclose(
        [sum(result.log_probs) for result in results], np.asarray(scores), atol=1e-4
    )


def test_sinusoid_table_is_interleaved_from_position_zero():
    table = sinusoid_table(60, 16)
    for position in (0, 1, 37, 59):
        for i in range(8):
            angle = position / 10000 ** (2 * i / 16)
            assert table[position, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[position, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize(
    "overrides, setting",
    [
        (dict(key_dim=8), "key_dim=8"),
        (dict(value_dim=32), "value_dim=32"),
        (dict(activation="elu"), "activation='elu'"),
        (dict(attention_window=4), "attention_window=4"),
        (dict(word_positions=True), "word_positions=True"),
    ],
)
def test_unsupported_settings_are_refused_by_name(overrides, setting):
    config = get_preset("tiny", hidden_dim=64, num_heads=4, **overrides)
    with pytest.raises(ValueError, match=f"CTranslate2 cannot express {setting}"):
        check_ctranslate2_config(config)


def test_run_of_unsupported_preset_is_refused_before_loading(tmp_path):
    """A run of Table 3 (B)'s d_k=16 preset: refused by name before its (absent) weights
    are read, nothing written."""
    from keras_transformer.training import TrainOptions
    from keras_transformer.training.trainer import write_run_config

    write_run_config(tmp_path / "run", get_preset("table3_b_dk16"), TrainOptions())
    with pytest.raises(ValueError, match="CTranslate2 cannot express key_dim=16"):
        export_ctranslate2(tmp_path / "run", tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_export_script_writes_ctranslate2_models(trained_run, tmp_path):
    output_dir = tmp_path / "numbers_int8"
    result = run_script(
        "export.py",
        f"--model_dir={trained_run}",
        "--format=ctranslate2",
        "--quantization=int8",
        f"--export_dir={tmp_path}",
        "--name=numbers_int8",
        "--sample=three hundred and four",
    )
    assert f"Exported {output_dir} (CTranslate2, int8)" in result.stdout
    assert "Sample (loaded export): 'three hundred and four' -> " in result.stdout
    assert sorted(path.name for path in output_dir.iterdir()) == [
        "config.json",
        "model.bin",
        "shared_vocabulary.json",
        "spm.model",
    ]


def test_a_marian_run_exports_and_translates_as_ours(multi30k_dir, tmp_path):
    """A run with a Marian tokenizer pair of separate vocabularies and every Marian option
    (random weights): the export holds the pair's files and both vocabularies, and
    CTranslate2's greedy and beam outputs and log-probabilities are our search's."""
    from keras_transformer import runs
    from keras_transformer.data.marian import MarianTokenizer
    from keras_transformer.models import build_model
    from keras_transformer.training import TrainOptions
    from keras_transformer.training.checkpoints import checkpoint_manager, save_checkpoint
    from keras_transformer.training.trainer import write_run_config
    from tests.test_marian_tokenizer import write_marian_tokenizer

    run = write_marian_tokenizer(tmp_path / "run", multi30k_dir, separate=True)
    tokenizer = MarianTokenizer(run)
    config = get_preset(
        "tiny",
        vocabulary_size=tokenizer.vocabulary_size,
        target_vocabulary_size=tokenizer.target_vocabulary_size,
        share_embeddings=False,
        sinusoid_layout="concatenated",
        activation="silu",
        final_logits_bias=True,
        layer_norm_epsilon=1e-5,
        num_encoder_layers=2,
        num_decoder_layers=2,
        hidden_dim=32,
        intermediate_dim=48,
        num_heads=4,
        max_length=32,
    )
    assert vocabulary(tokenizer, target=True) != vocabulary(tokenizer)  # two vocabularies
    write_run_config(run, config, TrainOptions())
    model = build_model(config)
    assign_random_weights(model)
    save_checkpoint(
        checkpoint_manager(
            tf.train.Checkpoint(model=model), runs.checkpoint_dir(run), max_to_keep=None
        ),
        0,
    )
    model_dir = export_ctranslate2(run, tmp_path / "ct2")
    for name in ("source.spm", "target.spm", "vocab.json", "target_vocab.json"):
        assert (model_dir / name).read_bytes() == (run / name).read_bytes()
    assert json.loads((model_dir / "target_vocabulary.json").read_text()) == vocabulary(
        tokenizer, target=True
    )
    assert json.loads((model_dir / "source_vocabulary.json").read_text()) == vocabulary(tokenizer)
    texts = [source for source, _ in load_pairs("multi30k", "val", data_dir=multi30k_dir)[:12]]
    loaded = load_run(run)
    for beam_size in (1, 4):
        agreement, max_difference = _compare(texts, *loaded, model_dir, beam_size)
        assert agreement == 1.0 and max_difference <= LOG_PROB_TOLERANCE


def test_an_imported_opus_mt_run_translates_as_ours(multi30k_dir, tmp_path):
    """A random-initialised Marian (OPUS-MT) checkpoint imported as a run (`pretrained`): its
    CTranslate2 export gives our greedy and beam search's outputs and log-probabilities."""
    from keras_transformer import pretrained
    from tests.test_pretrained import write_marian_directory

    marian_dir = write_marian_directory(tmp_path / "marian", multi30k_dir)
    run = pretrained.import_marian(marian_dir, tmp_path / "run")
    loaded = load_run(run)
    config = loaded[2]
    assert (config.sinusoid_layout, config.activation, config.final_logits_bias) == (
        "concatenated",
        "silu",
        True,
    )
    model_dir = export_ctranslate2(run, tmp_path / "ct2")
    texts = [source for source, _ in load_pairs("multi30k", "val", data_dir=multi30k_dir)[:12]]
    for beam_size in (1, 4):
        agreement, max_difference = _compare(texts, *loaded, model_dir, beam_size)
        assert agreement == 1.0 and max_difference <= LOG_PROB_TOLERANCE
