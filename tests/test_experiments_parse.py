"""Smoke tests of the parsing scripts: train.py --dataset=ptb --preset=ptb_wsj on the sample
arranged in WSJ section folders, parse.py, evaluate.py --dataset=ptb and evalb.py."""

import re

import pytest

from keras_transformer.data.treebank import load_ptb_pairs
from keras_transformer.data.trees import parse_tree, sentence_words
from tests import runtimes
from tests.scripts import ScriptSession, run_script

TINY = dict(
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=32,
    intermediate_dim=64,
    num_heads=2,
    vocabulary_size=400,
    max_length=128,
    train_steps=2,
    warmup_steps=1,
)


@pytest.fixture(scope="module")
def sections(tmp_path_factory, ptb_sample_dir):
    """A few sample files as WSJ sections 02, 22 and 23 (links, nothing copied)."""
    root = tmp_path_factory.mktemp("wsj")
    layout = {"02": range(1, 13), "22": (13,), "23": (14,)}
    for section, numbers in layout.items():
        (root / section).mkdir()
        for number in numbers:
            (root / section / f"wsj_{section}{number:02d}.mrg").symlink_to(
                ptb_sample_dir / f"wsj_{number:04d}.mrg"
            )
    return root


@pytest.fixture(scope="module")
def ptb_run(tmp_path_factory, sections):
    """The ptb_wsj preset (shrunk) trained 2 steps on the sections by the training code."""
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import DataOptions, TrainOptions, train_translation

    config = get_preset("ptb_wsj", **TINY)
    assert (config.beam_size, config.length_penalty, config.max_output_offset) == (21, 0.3, 300)
    run_dir = tmp_path_factory.mktemp("ptb_run")
    options = TrainOptions(
        batch_tokens=1024, checkpoint_every=2, eval_every=0, log_every=1, progress=False
    )
    train_translation(config, run_dir, options, DataOptions("ptb", data_dir=str(sections)))
    return run_dir


def test_parse_script(ptb_run, sections, tmp_path):
    """Every tree holds its line's words (`sentence_words`); a word with invalid UTF-8 inside is
    parsed with U+FFFD in its place and a warning naming the line, brackets come out -LRB-/-RRB-."""
    sentences = sorted((words for words, _ in load_ptb_pairs(sections, "val")), key=len)[:3]
    crafted = b"He said ( caf\xe9 )\tok ."
    (tmp_path / "in.txt").write_bytes(
        "".join(f"{s}\n" for s in sentences).encode() + crafted + b"\n"
    )
    result = run_script(
        "parse.py",
        f"--model_dir={ptb_run}",
        f"--input={tmp_path / 'in.txt'}",
        f"--output={tmp_path / 'out.txt'}",
        "--beam_size=2",
        "--max_output_offset=10",
    )
    trees = [parse_tree(line) for line in (tmp_path / "out.txt").read_text().splitlines()]
    lines = [*sentences, crafted.decode("utf-8", errors="replace")]
    assert [tree.words() for tree in trees] == [sentence_words(line) for line in lines]
    assert trees[-1].words() == ["He", "said", "-LRB-", "caf\ufffd", "-RRB-", "ok", "."]
    assert (
        f"Warning: {tmp_path / 'in.txt'}, line 4: invalid UTF-8 replaced by U+FFFD"
        in result.stderr.splitlines()
    )
    assert "parsed 4/4 sentences" in result.stderr


def test_parse_script_rejects_a_word_the_tokenizer_deletes(ptb_run, tmp_path):
    """A word that was only invalid UTF-8 is U+FFFD, which the tokenizer's normalisation deletes:
    a warning, then one error line naming the line and the word, and no output."""
    (tmp_path / "in.txt").write_bytes(b"Ms. Haag plays .\nIt \xff is .\n")
    result = run_script(
        "parse.py",
        f"--model_dir={ptb_run}",
        f"--input={tmp_path / 'in.txt'}",
        f"--output={tmp_path / 'out.txt'}",
        check=False,
    )
    assert result.returncode == 1
    name = tmp_path / "in.txt"
    assert result.stderr.strip().splitlines()[-2:] == [
        f"Warning: {name}, line 2: invalid UTF-8 replaced by U+FFFD",
        f"error: {name}, line 2: word 2, '\ufffd': the tokenizer's normalisation deletes it "
        "(the tree must hold the line's words one for one)",
    ]
    assert not (tmp_path / "out.txt").exists()


def test_parse_script_with_an_ensemble(ptb_word_run, sections, tmp_path):
    """`--ensemble`: the run with itself averages two equal distributions, so its trees are the
    run's own (as `Parser` gives them in this process)."""
    from keras_transformer.decoding import Parser
    from keras_transformer.runs import load_run

    sentences = sorted((words for words, _ in load_ptb_pairs(sections, "val")), key=len)[:3]
    (tmp_path / "in.txt").write_text("".join(f"{s}\n" for s in sentences))
    run_script(
        "parse.py",
        f"--model_dir={ptb_word_run}",
        f"--ensemble={ptb_word_run}",
        f"--input={tmp_path / 'in.txt'}",
        f"--output={tmp_path / 'out.txt'}",
        "--beam_size=2",
        "--max_output_offset=10",
    )
    model, tokenizer, config = load_run(ptb_word_run)
    parser = Parser(
        model,
        tokenizer,
        "beam",
        beam_size=2,
        length_penalty=config.length_penalty,
        max_output_offset=10,
    )
    assert (tmp_path / "out.txt").read_text().splitlines() == parser(sentences)


def test_an_ensemble_of_runs_with_different_tokenizers_fails_naming_the_file(ptb_run, ptb_word_run):
    from keras_transformer.runs import load_ensemble, tokenizer_path

    message = f"{tokenizer_path(ptb_word_run)} is not the tokenizer of {ptb_run}: "
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        load_ensemble([ptb_run, ptb_word_run])


def test_parse_script_rejects_a_blank_line(ptb_run, tmp_path):
    (tmp_path / "in.txt").write_text("Ms. Haag plays .\n\nIt is .\n")
    result = run_script(
        "parse.py",
        f"--model_dir={ptb_run}",
        f"--input={tmp_path / 'in.txt'}",
        f"--output={tmp_path / 'out.txt'}",
        check=False,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {tmp_path / 'in.txt'}, line 2: a blank line (one tokenized sentence per line)"
    ]
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert not (tmp_path / "out.txt").exists()


def test_evaluate_script_reports_evalb_figures(ptb_run, sections, tmp_path):
    result = run_script(
        "evaluate.py",
        f"--model_dir={ptb_run}",
        "--dataset=ptb",
        f"--data_dir={sections}",
        "--split=val",
        "--max_sentences=3",
        "--method=greedy",
        "--max_output_offset=10",
        f"--gold_output={tmp_path / 'gold.trees'}",
    )
    gold = [parse_tree(line) for line in (tmp_path / "gold.trees").read_text().splitlines()]
    assert [" ".join(tree.words()) for tree in gold] == [
        words for words, _ in load_ptb_pairs(sections, "val")[:3]
    ]
    assert "ptb/val: 3 sentences parsed" in result.stdout
    assert result.stderr.splitlines()[-1] == "parsed 3/3 sentences"  # one batch (the default 64)
    for label in ("Bracketing FMeasure       = ", "Tagging accuracy          = ", "-- len<=40 --"):
        assert label in result.stdout


def test_evalb_script(evalb_sample_dir):
    result = run_script(
        "evalb.py",
        str(evalb_sample_dir / "ptb5.gld"),
        str(evalb_sample_dir / "ptb5.tst"),
        "--sentences",
    )
    assert result.stdout == (evalb_sample_dir / "ptb5.rsl").read_text()


def _parse_with_saved_model(run, sections, tmp_path, extra=(), rejected=()):
    """`(Parser's trees, the exported default signature's trees)` of the 4 shortest validation
    sentences and the `extra` lines with the same settings; the signature also gets the
    `rejected` lines (after the others), which `Parser` refuses."""
    import tensorflow as tf

    from keras_transformer.decoding import Parser
    from keras_transformer.export.parser import ParsingModule
    from keras_transformer.runs import load_run

    sentences = sorted((words for words, _ in load_ptb_pairs(sections, "val")), key=len)[:4] + list(
        extra
    )
    settings = dict(beam_size=2, length_penalty=0.3, max_output_offset=10)
    model, tokenizer, _ = load_run(run)
    parser = Parser(model, tokenizer, "beam", **settings)
    expected = parser(sentences)
    for line in rejected:
        with pytest.raises(ValueError, match="^input, line 1: "):
            parser.check([line])
    module = ParsingModule(model, tokenizer, **settings)
    tf.saved_model.save(
        module,
        str(tmp_path),
        signatures={"serving_default": module.translate.get_concrete_function()},
    )
    loaded = tf.saved_model.load(str(tmp_path))
    outputs = loaded.signatures["serving_default"](text=tf.constant(sentences + list(rejected)))
    return expected, [tree.decode() for tree in outputs["translation"].numpy()]


def test_exported_parser_returns_the_trees_of_parse(ptb_run, sections, tmp_path):
    """The exported parser's default signature (`ParsingModule.translate`, saved and loaded back)
    takes tokenized sentences and returns the trees that `Parser` (parse.py) gives with the same
    settings, on lines that `sentence_words` splits at every kind of whitespace and whose
    brackets it writes -LRB-/-RRB-; a blank line, and lines with a word the tokenizer does not
    keep as one word (which `Parser` rejects), get "". (Only that signature is saved here:
    export_saved_model traces all five.)"""
    from keras_transformer.export.parser import is_parsing_run

    assert is_parsing_run(ptb_run)
    kept = ["He said ( yes )\t.", "a\u00a0b \x85 c\u3000d", "caf\ufffd \u2603"]
    rejected = ["a \u200b b", "a\u2581b c", "a \ufffd b"]
    expected, served = _parse_with_saved_model(
        ptb_run, sections, tmp_path, extra=kept, rejected=[*rejected, ""]
    )
    assert served == expected + [""] * 4
    assert [parse_tree(tree).words() for tree in expected[-3:]] == [
        sentence_words(line) for line in kept
    ]


@pytest.fixture(scope="module")
def ptb_word_run(tmp_path_factory, sections):
    """The ptb_sample preset (shrunk, BPE tokenizer): word positions and a word window of 0, trained 2 steps."""
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import DataOptions, TrainOptions, train_translation

    config = get_preset("ptb_sample", **TINY, tokenizer_type="bpe")
    assert (config.word_positions, config.word_window, config.beam_size, config.length_penalty) == (
        True,
        0,
        21,
        0.3,
    )
    run_dir = tmp_path_factory.mktemp("ptb_word_run")
    options = TrainOptions(
        batch_tokens=1024, checkpoint_every=2, eval_every=0, log_every=1, progress=False
    )
    train_translation(config, run_dir, options, DataOptions("ptb", data_dir=str(sections)))
    return run_dir


def test_word_position_run_keeps_the_table_of_its_tokenizer(ptb_word_run):
    """The trainer sets the table from the run's tokenizer and the checkpoint holds it: a model
    loaded from the run (built with an all-zero table) has it back."""
    import numpy as np

    from keras_transformer.models.parsing import word_kinds
    from keras_transformer.runs import load_run

    model, tokenizer, config = load_run(ptb_word_run)
    assert config.word_positions and config.word_window == 0 and config.tokenizer_type == "bpe"
    np.testing.assert_array_equal(model.word_index.kinds.numpy(), word_kinds(tokenizer))
    assert model.word_index.kinds.numpy().max() == 2


def test_exported_word_position_parser_returns_the_trees_of_parse(ptb_word_run, sections, tmp_path):
    expected, served = _parse_with_saved_model(ptb_word_run, sections, tmp_path)
    assert served == expected


@pytest.mark.parametrize("runtime", runtimes.selected_runtimes())
def test_exported_word_position_parser_parses_in_the_serving_runtime(
    ptb_word_run, sections, tmp_path, runtime
):
    """The recipe's parser exported as export.py does it (ops checked against this TensorFlow's model
    server before publishing), loaded in a clean environment holding only a released model server's
    TensorFlow and TensorFlow Text: its trees are those of `parse.py`."""
    from keras_transformer.decoding import Parser
    from keras_transformer.export import export_saved_model
    from keras_transformer.export.parser import ParsingModule
    from keras_transformer.runs import load_run
    from tests.test_export import call_signature_in_runtime

    sentences = sorted((words for words, _ in load_ptb_pairs(sections, "val")), key=len)[:3]
    settings = dict(beam_size=2, length_penalty=0.3, max_output_offset=10)
    model, tokenizer, _ = load_run(ptb_word_run)
    expected = Parser(model, tokenizer, "beam", **settings)(sentences)
    result = export_saved_model(
        ParsingModule(model, tokenizer, **settings),
        tmp_path,
        "parser",
        warmup_sentences=sentences[:1],
        verify=False,
    )
    assert result.ops.ok, result.ops.summary()
    python, _, _ = runtimes.runtime_python(runtime)
    outputs = call_signature_in_runtime(
        python, result.path, "serving_default", runtime=runtime, text=sentences
    )
    assert outputs["translation"] == expected


def test_parse_script_answers_each_stdin_line_before_the_next(ptb_run, sections):
    """Each sentence is written only after the previous one's tree was read (stdin stays open);
    a blank line then stops the run with one line naming it (line 3 of stdin)."""
    sentences = sorted((words for words, _ in load_ptb_pairs(sections, "val")), key=len)[:2]
    args = (f"--model_dir={ptb_run}", "--beam_size=2", "--max_output_offset=10")
    with ScriptSession("parse.py", *args) as session:
        timeout = 600  # the first tree waits for the model to load
        for sentence in sentences:
            session.send(sentence)
            assert parse_tree(session.answer(timeout)).words() == sentence_words(sentence)
            timeout = 120  # the model is loaded: a tree in seconds
        session.send("")
        status, stderr = session.close(120)
    assert status == 1
    assert stderr.strip().splitlines()[-1] == (
        "error: <stdin>, line 3: a blank line (one tokenized sentence per line)"
    )


def test_parse_script_nbest(ptb_run, sections, tmp_path):
    """`--nbest=2`: two trees per sentence, best first, each over the sentence's words."""
    sentences = sorted((words for words, _ in load_ptb_pairs(sections, "val")), key=len)[:2]
    (tmp_path / "in.txt").write_text("".join(f"{s}\n" for s in sentences))
    stdout = run_script(
        "parse.py",
        f"--model_dir={ptb_run}",
        f"--input={tmp_path / 'in.txt'}",
        "--beam_size=2",
        "--max_output_offset=10",
        "--nbest=2",
    ).stdout
    rows = [line.split("\t") for line in stdout.splitlines()]
    assert [int(index) for index, _, _ in rows] == [0, 0, 1, 1]
    for index, sentence in enumerate(sentences):
        scores = [float(score) for i, score, _ in rows if int(i) == index]
        assert scores == sorted(scores, reverse=True)
        for i, _, tree in rows:
            if int(i) == index:
                assert parse_tree(tree).words() == sentence_words(sentence)
