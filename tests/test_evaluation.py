"""sacreBLEU scoring, batched translation, and evaluating a trained run or a SavedModel."""

import doctest
import shutil

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer.benchmark.decoding import (
    DecodingSpeed,
    benchmark_decoding,
    format_speed_table,
    source_batches,
)
from keras_transformer.decoding import (
    Translator,
    decode_lines,
    translate_in_batches,
    translate_lines,
)
from keras_transformer.evaluation import (
    corpus_bleu,
    corpus_chrf,
    default_tokenize,
    evaluate_run,
    evaluate_saved_model,
    score_corpus,
)

HYPOTHESES = [
    "The cat sat on the mat.",
    "A dog runs in the park, quickly!",
    "Zwei Männer spielen Fußball.",
    "the quick brown fox",
]
REFERENCES = [
    "The cat sat on the mat.",
    "A dog is running in the park.",
    "Zwei Männer spielen Fussball.",
    "The quick brown fox jumps.",
]


def test_perfect_match_is_100():
    score, signature, details = corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert score == pytest.approx(100.0)
    assert details.startswith("BLEU = 100.00")
    chrf, _ = corpus_chrf(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert chrf == pytest.approx(100.0)


def test_bleu_by_hand():
    # Precisions 4/5, 3/4, 2/3, 1/2, equal lengths (BP = 1): BLEU = (0.2) ** (1/4).
    score, _, _ = corpus_bleu(["a b c d e"], ["a b c d f"])
    assert score == pytest.approx(100 * 0.2**0.25, abs=1e-6)


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("tokenize", ["13a", "intl", "none", "char"])
def test_scores_equal_sacrebleu(lowercase, tokenize):
    scores = score_corpus(HYPOTHESES, REFERENCES, lowercase=lowercase, tokenize=tokenize)
    expected_bleu = sacrebleu.corpus_bleu(
        HYPOTHESES, [REFERENCES], lowercase=lowercase, tokenize=tokenize
    )
    fold = str.lower if lowercase else str  # corpus_chrf has no lowercase option
    expected_chrf = sacrebleu.corpus_chrf(
        [fold(h) for h in HYPOTHESES], [[fold(r) for r in REFERENCES]]
    )
    assert scores.bleu == pytest.approx(expected_bleu.score)
    assert scores.chrf == pytest.approx(expected_chrf.score)
    assert scores.bleu_details == str(expected_bleu)
    assert 0 < scores.bleu < 100 and scores.num_sentences == 4
    assert scores.exact_match == pytest.approx(0.25)
    case = "case:lc" if lowercase else "case:mixed"
    assert (
        scores.bleu_signature
        == f"nrefs:1|{case}|eff:no|tok:{tokenize}|smooth:exp|version:{sacrebleu.__version__}"
    )
    assert (
        scores.chrf_signature
        == f"nrefs:1|{case}|eff:yes|nc:6|nw:0|space:no|version:{sacrebleu.__version__}"
    )
    lines = scores.format().splitlines()
    assert lines[0] == f"BLEU = {scores.bleu:.2f} {scores.bleu_signature}"
    assert lines[1] == f"chrF2 = {scores.chrf:.2f} {scores.chrf_signature}"


def test_multiple_reference_streams():
    other = ["A cat sat on a mat.", "A dog runs in the park, quickly!", "x", "y"]
    scores = score_corpus(HYPOTHESES, [REFERENCES, other])
    assert scores.bleu == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, other]).score
    )
    assert scores.bleu_signature.startswith("nrefs:2|")
    assert scores.exact_match == pytest.approx(0.5)


def test_one_word_sentences_need_character_bleu():
    # The built-in task's German side is one word: word BLEU is 0 even for a perfect system.
    assert (
        score_corpus(["einundzwanzig", "vierhundert"], ["einundzwanzig", "vierhundert"]).bleu == 0
    )
    scores = score_corpus(
        ["einundzwanzig", "vierhundert"], ["einundzwanzig", "vierhundert"], tokenize="char"
    )
    assert scores.bleu == pytest.approx(100.0) and "tok:char" in scores.bleu_signature
    assert default_tokenize("builtin") == "char" and default_tokenize("multi30k") == "13a"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: corpus_bleu(["a", "b"], ["a"]), "one reference per hypothesis"),
        (lambda: corpus_bleu(["a"], "a"), "not a single string"),
        (lambda: corpus_bleu([], []), "No hypotheses"),
        (lambda: corpus_bleu(["a"], ["a"], tokenize="moses"), "Unknown BLEU tokenizer"),
    ],
)
def test_invalid_inputs_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_translate_in_batches_sorts_and_restores_order():
    batches = []

    def translate_batch(texts):
        batches.append(list(texts))
        return [text.upper() for text in texts], [float(len(text)) for text in texts]

    texts = ["bb", "a", "dddd", "ccc", "eeeee"]
    translations, scores = translate_in_batches(translate_batch, texts, batch_size=2)
    assert translations == ["BB", "A", "DDDD", "CCC", "EEEEE"]
    assert scores == [2.0, 1.0, 4.0, 3.0, 5.0]
    assert batches == [["eeeee", "dddd"], ["ccc", "bb"], ["a"]]
    counted = []
    assert translate_in_batches(
        translate_batch, texts, batch_size=2, progress=lambda *done: counted.append(done)
    ) == (translations, scores)
    assert counted == [(2, 5), (4, 5), (5, 5)]
    with pytest.raises(ValueError, match="batch_size"):
        translate_in_batches(translate_batch, texts, batch_size=0)


def test_translate_lines_keeps_blank_lines():
    seen = []

    def translate(texts):
        seen.extend(texts)
        return [text[::-1] for text in texts], [1.0] * len(texts)

    translations, scores = translate_lines(translate, ["abc", "", "  ", "de"])
    assert translations == ["cba", "", "", "ed"] and seen == ["abc", "de"]
    assert scores == [
        1.0,
        0.0,
        0.0,
        1.0,
    ]  # blank lines score 0.0, as the SavedModel scores an empty text


def test_decode_lines_replaces_invalid_utf8_as_the_saved_model_does():
    data = b"one\r\ntwo \xff\xfe three \xc3\n\nf\xc3\xbcnf\x0bsechs\xe2\x80\xa8"
    lines, replaced = decode_lines(data)
    # Only "\n" ends a line (not \x0b, not U+2028); "\r\n" counts as "\n"; the last line has no "\n".
    assert lines == ["one", "two \ufffd\ufffd three \ufffd", "", "f\u00fcnf\x0bsechs\u2028"]
    assert replaced == [1]
    # The same replacement as Python's (which the SavedModel tests compare against).
    assert lines[1] == b"two \xff\xfe three \xc3".decode("utf-8", errors="replace")
    assert decode_lines(b"") == ([], []) and decode_lines(b"\n") == ([""], [])


def test_format_speed_table():
    def speed(name, use_cache, seconds, outputs):
        return DecodingSpeed(name, use_cache, 2, 6, seconds, 0.1, outputs)

    same = [np.array([5, 6, 3]), np.array([7, 8, 3])]
    table = format_speed_table(
        [
            speed("greedy", True, 1.0, same),
            speed("greedy", False, 3.0, same),
            speed("beam4", True, 1.0, same),
            speed("beam4", False, 12.0, [same[0], np.array([7, 3])]),
        ]
    )
    assert (
        "greedy: cached/recompute speedup 3.0x (identical outputs for 100% of sentences)" in table
    )
    assert "beam4: cached/recompute speedup 12.0x (identical outputs for 50% of sentences)" in table
    assert table.splitlines()[2].split() == ["greedy", "cached", "2", "6", "1.000", "2.00", "6.0"]
    assert table.splitlines()[3].split()[:2] == ["greedy", "recompute"]


@pytest.mark.parametrize(
    "module_name",
    ["keras_transformer.evaluation", "keras_transformer.evaluation.bleu"],
)
def test_docstring_examples_run(module_name):
    import importlib

    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.fixture(scope="module")
def beam_translator(run_model):
    """The paper's beam search (beam 4, alpha 0.6), traced once for the module."""
    model, tokenizer, _ = run_model
    return Translator(model, tokenizer, "beam", beam_size=4, length_penalty=0.6)


def test_evaluate_run_scores_and_writes_hypotheses(trained_run, beam_translator, tmp_path):
    from keras_transformer.data.sources import load_pairs

    output = tmp_path / "out" / "hypotheses.de"
    counted = []
    result = evaluate_run(
        trained_run,
        split="test",
        max_sentences=12,
        batch_size=5,
        output=output,
        progress=lambda *done: counted.append(done),
    )
    assert counted == [(5, 12), (10, 12), (12, 12)]
    pairs = load_pairs("builtin", "test")[:12]
    assert result.sources == [source for source, _ in pairs]
    assert result.references == [target for _, target in pairs]
    assert output.read_text(encoding="utf-8").splitlines() == result.hypotheses
    assert len(result.hypotheses) == 12 and all("\n" not in h for h in result.hypotheses)
    assert 0 <= result.scores.bleu <= 100 and 0 <= result.scores.chrf <= 100
    assert "tok:char" in result.scores.bleu_signature and result.scores.chrf_signature.startswith(
        "nrefs:1|"
    )
    assert result.settings["beam_size"] == 4 and result.settings["length_penalty"] == 0.6
    assert result.seconds > 0
    # Length-sorted batches of 5 give the same translations as one sentence at a time.
    expected = [beam_translator.translate_batch([source])[0][0] for source in result.sources]
    assert result.hypotheses == expected
    assert result.scores == score_corpus(expected, result.references, tokenize="char")


def test_evaluate_run_with_an_ensemble_searches_with_both_models(
    trained_run, run_model, beam_translator
):
    """`ensemble=`: the run's checkpoint of step 60 (`checkpoint=`) with its latest (step 120)."""
    from keras_transformer.decoding import Ensemble
    from keras_transformer.training import load_run

    early = str(trained_run / "checkpoints" / "ckpt-60")
    result = evaluate_run(
        trained_run,
        split="test",
        max_sentences=12,
        batch_size=5,
        checkpoint=early,
        ensemble=[trained_run],
    )
    assert result.settings["ensemble"] == str(trained_run)
    model, tokenizer, _ = load_run(trained_run, checkpoint=early)
    both = Translator(
        Ensemble([model, run_model[0]]), tokenizer, "beam", beam_size=4, length_penalty=0.6
    )
    assert result.hypotheses == [both.translate_batch([source])[0][0] for source in result.sources]
    alone = [
        beam_translator.translate_batch([source])[0][0] for source in result.sources
    ]  # step 120 alone
    assert result.hypotheses != alone


def test_score_checkpoints_scores_each_step_as_evaluate_run_would_have_then(trained_run, tmp_path):
    """`score_checkpoints` with `ensemble=` and `average_last=`: each step's score is `evaluate_run`'s on
    the runs as they were at that step. The second run is `trained_run` cut back to its step-60 checkpoint,
    so at step 120 the pair is (120, 60), and (60, 60) at step 60."""
    from keras_transformer.data.sources import load_pairs
    from keras_transformer.evaluation import score_checkpoints

    other = tmp_path / "other"
    shutil.copytree(trained_run, other)
    early = str(other / "checkpoints" / "ckpt-60")
    tf.compat.v1.train.update_checkpoint_state(str(other / "checkpoints"), early, [early])
    pairs = load_pairs("builtin", "test")[:12]
    search = dict(method="beam", beam_size=4, length_penalty=0.6, tokenize="char")
    results = score_checkpoints(trained_run, pairs, ensemble=[other], **search)
    assert [result.step for result in results] == [60, 120]
    for result in results:
        expected = evaluate_run(
            trained_run, pairs=pairs, checkpoint=result.path, ensemble=[other], **search
        )
        assert result.scores == expected.scores
    alone = evaluate_run(trained_run, pairs=pairs, **search)  # step 120 without the other run
    assert results[1].scores.chrf != alone.scores.chrf
    # Averaged: only step 120 has two checkpoints up to it.
    (averaged,) = score_checkpoints(
        trained_run, pairs, average_last=2, ensemble=[trained_run], **search
    )
    expected = evaluate_run(
        trained_run, pairs=pairs, average_last=2, ensemble=[trained_run], **search
    )
    assert averaged.step == 120 and averaged.scores == expected.scores
    assert averaged.scores.chrf != alone.scores.chrf
    with pytest.raises(
        ValueError, match=r"holds 1 up to step 120.*--keep_checkpoints >= 2"
    ) as error:
        score_checkpoints(trained_run, pairs, average_last=2, ensemble=[other], **search)
    assert str(other / "checkpoints") in str(error.value)
    with pytest.raises(ValueError, match=r"last 3 checkpoints, but .* holds 2\. Average fewer"):
        score_checkpoints(trained_run, pairs, average_last=3, **search)


def test_translator_output_ids_and_scores(run_model):
    model, tokenizer, _ = run_model
    translator = Translator(model, tokenizer, "greedy", batch_size=2)
    texts = ["twenty one", "four hundred thousand three", "seven"]
    translations, scores = translator(texts)
    ids = translator.output_ids(texts)
    assert len(translations) == len(scores) == len(ids) == 3
    assert all(row and 0 not in row and 2 not in row for row in ids)
    detokenized = [
        t.decode("utf-8")
        for t in tokenizer.detokenize(tf.ragged.constant(ids, dtype=tf.int32)).numpy()
    ]
    assert detokenized == translations
    assert all(score <= 0 for score in scores)
    assert translator([]) == ([], [])


def test_evaluate_saved_model(run_model, beam_translator, tmp_path):
    from keras_transformer.export import TranslationModule, export_saved_model

    model, tokenizer, _ = run_model
    export = export_saved_model(
        TranslationModule(model, tokenizer), tmp_path, "numbers", verify=False, check_ops=False
    )
    export_dir = export.path  # <tmp>/numbers/1, beam 4 and alpha 0.6 from the run config
    pairs = [
        ("twenty one", "einundzwanzig"),
        ("four hundred thousand three", "vierhunderttausenddrei"),
        ("seven", "sieben"),
    ]
    counted = []
    result = evaluate_saved_model(
        export_dir,
        pairs,
        batch_size=2,
        tokenize="char",
        output=tmp_path / "hyp.txt",
        progress=lambda *done: counted.append(done),
    )
    assert counted == [(2, 3), (3, 3)]
    expected, _ = beam_translator([source for source, _ in pairs])
    assert result.hypotheses == expected
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == expected
    assert result.scores == score_corpus(expected, [target for _, target in pairs], tokenize="char")
    with pytest.raises(ValueError, match="takes no input 'text'. Its inputs: \\['source_ids'\\]"):
        evaluate_saved_model(export_dir, pairs, signature="translate_ids")
    with pytest.raises(
        ValueError, match="has no signature 'nope'. Its signatures: score, serving_default"
    ):
        evaluate_saved_model(export_dir, pairs, signature="nope")
    # A model root: its highest version. A directory that is no SavedModel: an error naming it.
    assert evaluate_saved_model(export_dir.parent, pairs).settings["saved_model"] == str(export_dir)
    shutil.copytree(export_dir, export_dir.parent / "2")
    assert evaluate_saved_model(export_dir.parent, pairs).settings["saved_model"] == str(
        export_dir.parent / "2"
    )
    with pytest.raises(
        FileNotFoundError,
        match=f"^{tmp_path} is not a SavedModel \\(no saved_model.pb\\) nor a model root",
    ):
        evaluate_saved_model(tmp_path, pairs)
    # A highest version without its files (a copy that stopped) is skipped; with no complete
    # version left, an error naming the root.
    (export_dir.parent / "3").mkdir()
    assert evaluate_saved_model(export_dir.parent, pairs).settings["saved_model"] == str(
        export_dir.parent / "2"
    )
    for version in ("1", "2"):
        (export_dir.parent / version / "saved_model.pb").unlink()
    with pytest.raises(
        FileNotFoundError, match=f"^No complete version in {export_dir.parent}: every version lacks"
    ):
        evaluate_saved_model(export_dir.parent, pairs)


def test_xla_decoding_benchmark_pads_widths_and_matches_graph_mode(run_model):
    model, tokenizer, _ = run_model
    texts = [
        "twenty one",
        "four hundred thousand three",
        "seven",
        "nine hundred ninety nine thousand",
        "two",
    ]
    batches = source_batches(tokenizer, texts, 2, model.config.max_length, width_multiple=8)
    assert [batch.shape[0] for batch in batches] == [2, 2, 1] and all(
        batch.shape[1] % 8 == 0 for batch in batches
    )
    plain = source_batches(tokenizer, texts, 2, model.config.max_length)
    for padded, ids in zip(batches, plain):
        np.testing.assert_array_equal(padded[:, : ids.shape[1]], ids)
        assert not padded[:, ids.shape[1] :].any()
    options = dict(batch_size=2, methods=["greedy"], max_output_offset=8)
    graph = benchmark_decoding(model, tokenizer, texts, **options)
    xla = benchmark_decoding(model, tokenizer, texts, jit_compile=True, **options)
    assert [(r.name, r.use_cache) for r in xla] == [("greedy", True), ("greedy", False)]
    for result in graph + xla:
        assert [list(row) for row in result.outputs] == [list(row) for row in graph[0].outputs]
