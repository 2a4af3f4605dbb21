"""Parsing as its own model (`models.parsing`): the core Transformer, its config, the trainer and
the searches know nothing of word positions; runs written before the split still load."""

import ast
import dataclasses
import itertools
import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_transformer
from keras_transformer import runs
from keras_transformer.decoding import TreeConstraint, beam_search, greedy_search
from keras_transformer.decoding.tree_constraint import CLOSING, END, OPEN, OTHER, TAG
from keras_transformer.models import (
    ParsingConfig,
    ParsingTransformer,
    Transformer,
    TransformerConfig,
    build_model,
    get_preset,
    model_config,
)
from keras_transformer.models.parsing import word_kinds

PACKAGE = Path(keras_transformer.__file__).parent
# Runs written by the code before the parsing model was its own class (`tests/old_runs/README.md`).
OLD_RUNS = Path(__file__).parent / "old_runs"
# Where the names of the parsing mechanism may not appear (the list: the core model and
# config, the trainer, the searches' steps).
CORE_FILES = ("models/transformer.py", "models/config.py", "decoding/steps.py")
PARSING_NAMES = ("word_positions", "word_window", "word_kinds", "WordIndex", "word_index")
SMALL = dict(
    vocabulary_size=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=2,
    max_length=64,
)


def test_the_core_carries_nothing_of_parsing():
    names = {field.name for field in dataclasses.fields(TransformerConfig)}
    assert not names & {"word_positions", "word_window"}
    for path in [
        *CORE_FILES,
        *(p.relative_to(PACKAGE) for p in (PACKAGE / "training").glob("*.py")),
    ]:
        text = (PACKAGE / path).read_text()
        assert not [name for name in PARSING_NAMES if name in text], path


def _imported_modules(source, package):
    """Every module a module of `package` with this `source` imports, at any depth of its code
    (relative imports resolved)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(part for part in (base, node.module) if part)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _imports_decoding(source, package="keras_transformer.training"):
    return [
        name
        for name in _imported_modules(source, package)
        if name == "keras_transformer.decoding" or name.startswith("keras_transformer.decoding.")
    ]


def test_training_does_not_import_decoding():
    modules = sorted((PACKAGE / "training").glob("*.py"))
    assert len(modules) > 5
    assert {path.name: _imports_decoding(path.read_text()) for path in modules} == {
        path.name: [] for path in modules
    }


def test_the_import_rule_sees_nested_and_relative_imports():
    """The control: imports inside a function, relative ones, and `import a.b` are read."""
    assert _imports_decoding("def f():\n    from ..decoding import steps\n")
    assert _imports_decoding("from . import x\nfrom ..decoding.steps import tile_rows\n")
    assert _imports_decoding("import keras_transformer.decoding.steps as s\n")
    assert not _imports_decoding("from .. import data\nfrom ..data.tokenizer import Tokenizer\n")


@pytest.mark.parametrize(
    "values, config_class",
    [
        (dict(), TransformerConfig),
        (dict(word_positions=False, word_window=None), TransformerConfig),  # an old translation run
        (dict(word_positions=True), ParsingConfig),
        (dict(word_positions=True, word_window=0), ParsingConfig),
    ],
)
def test_the_fields_choose_the_config_and_the_model(values, config_class):
    config = model_config({**SMALL, **values})
    assert type(config) is config_class
    model = build_model(config)
    assert type(model) is (ParsingTransformer if config_class is ParsingConfig else Transformer)
    assert type(build_model(config.to_dict())) is type(model)


def test_presets_build_their_model():
    assert type(get_preset("ptb_sample")) is ParsingConfig
    assert (get_preset("ptb_sample").word_positions, get_preset("ptb_sample").word_window) == (
        True,
        0,
    )
    assert type(get_preset("ptb_wsj")) is TransformerConfig  # the paper's architecture
    assert type(get_preset("tiny", word_positions=True)) is ParsingConfig
    with pytest.raises(ValueError, match="^Unknown config field"):
        TransformerConfig().replace(word_positions=True)


def test_the_transformer_refuses_a_parsing_config_in_one_line():
    with pytest.raises(ValueError, match=r"a ParsingConfig builds a ParsingTransformer") as error:
        Transformer(get_preset("ptb_sample", **SMALL))
    assert "\n" not in str(error.value)


def _tokenizer(directory):
    from keras_transformer.data.tokenizer import train_sentencepiece

    words = ["".join(p) for n in (1, 2, 3) for p in itertools.product("ab", repeat=n)]
    sentences = [" ".join(p) for p in itertools.permutations(words, 3)]
    train_sentencepiece(sentences, runs.tokenizer_path(directory), 16)


@pytest.mark.parametrize(
    "name, model_class, kinds",
    [
        ("ptb_sample", ParsingTransformer, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0]),
        ("tiny", Transformer, None),
    ],
)
def test_old_runs_load_as_their_model(tmp_path, name, model_class, kinds):
    """A run written before the split (its config.json lists word_positions and word_window):
    `load_run` builds the model its fields describe, reads every weight of its checkpoint (the
    names follow the graph's order) and gives the logits the old code gave."""
    run = tmp_path / name
    shutil.copytree(OLD_RUNS / name, run)
    assert {"word_positions", "word_window"} <= set(
        json.loads((run / "config.json").read_text())["model"]
    )
    _tokenizer(run)
    model, _, config = runs.load_run(run)
    assert type(model) is model_class and type(config) is model_class.config_class
    if kinds is not None:
        np.testing.assert_array_equal(model.word_index.kinds.numpy(), kinds)
    expected = json.loads((run / "logits.json").read_text())
    inputs = {key: np.array(expected[key], np.int32) for key in ("source_ids", "target_ids")}
    np.testing.assert_allclose(model(inputs).numpy(), expected["logits"], rtol=0, atol=1e-6)


def test_a_new_parsing_run_writes_the_old_format(tmp_path):
    """What a ptb_sample run writes today reads back as before (the same "model" fields)."""
    from keras_transformer.training import TrainOptions
    from keras_transformer.training.trainer import write_run_config

    write_run_config(tmp_path, get_preset("ptb_sample"), TrainOptions())
    new = json.loads((tmp_path / "config.json").read_text())["model"]
    old = json.loads((OLD_RUNS / "ptb_sample" / "config.json").read_text())["model"]
    # the old fields, and the Transformer's options added since (at their defaults)
    added = {"sinusoid_layout", "final_logits_bias", "target_vocabulary_size"}
    assert set(new) == set(old) | added
    assert runs.read_run_config(tmp_path)[0] == get_preset("ptb_sample")


# --- the searches reach the word positions through the model's hooks ---

# A toy tree vocabulary (as tests/backend_harness.py's parsing check): PAD, UNK, BOS, EOS,
# six "(LABEL", ")", six tags, pieces that start a source word and pieces that continue one.
KINDS = (OTHER,) * 3 + (END,) + (OPEN,) * 6 + (CLOSING,) + (TAG,) * 6 + (OTHER,) * 15
WORD_STARTS = tuple(4 <= token < 25 for token in range(32))
SOURCE = np.array([(17, 25, 18, 19, 3, 0, 0), (20, 26, 27, 21, 22, 23, 3)], np.int32)


@pytest.fixture(scope="module", params=[None, 0], ids=["all_words", "word_window_0"])
def parsing_model(request):
    keras.utils.set_random_seed(1)
    model = build_model(
        get_preset("tiny", **SMALL, word_positions=True, word_window=request.param, dropout=0.0)
    )
    model.set_word_kinds(word_kinds(TreeConstraint(KINDS, WORD_STARTS)))
    return model


def test_cached_searches_equal_the_recomputed_ones(parsing_model):
    """The cached step gives `decode_step` the model's `source_inputs` and `prefix_inputs`; the
    recomputing step gives `decode` the source's and the model reads the prefix's itself: both
    searches find the same trees with the same scores."""
    constraint = TreeConstraint(KINDS, WORD_STARTS)
    for search, kwargs in ((greedy_search, {}), (beam_search, dict(beam_size=3, num_return=2))):
        found = [
            search(
                parsing_model,
                SOURCE,
                max_output_offset=10,
                use_cache=use_cache,
                constraint=constraint,
                **kwargs,
            )
            for use_cache in (True, False)
        ]
        np.testing.assert_array_equal(found[0][0].numpy(), found[1][0].numpy())
        np.testing.assert_allclose(found[0][1].numpy(), found[1][1].numpy(), rtol=0, atol=1e-4)
        tags = np.isin(found[0][0].numpy(), np.flatnonzero(np.array(KINDS) == TAG))
        words = tags.sum(axis=-1).reshape(len(SOURCE), -1)  # (B, hypotheses)
        assert (words == np.array([[3], [4]])).all()  # one tag per source word


def test_the_hooks_give_the_word_inputs(parsing_model):
    words = parsing_model.source_word_positions(SOURCE).numpy()
    inputs = parsing_model.source_inputs(SOURCE)
    if parsing_model.uses_word_window:
        np.testing.assert_array_equal(inputs["source_word_positions"].numpy(), words)
    else:
        assert inputs == {}
    target = np.array([[2, 4, 11, 12, 10, 3]], np.int32)  # BOS (X NN NN ) EOS
    prefix = parsing_model.prefix_inputs(target, np.int32(3))["word_positions"]
    assert prefix.numpy().tolist() == [[2]]  # two tags so far: the third word's tag comes next
    assert Transformer(get_preset("tiny", **SMALL)).prefix_inputs(target, np.int32(3)) == {}
