"""`SearchOptions`: the one home of the search settings, and the callers that build from it."""

import ast
import dataclasses
import json
import shutil

import numpy as np
import pytest
from absl import app, flags

from keras_transformer import Transformer, cli, get_preset
from keras_transformer.decoding import SearchOptions, beam_search, best_hypotheses
from tests.scripts import REPO, run_script

CONFIG = get_preset("tiny", beam_size=6, length_penalty=1.0, max_output_offset=10)


def test_from_config_takes_the_run_settings_and_explicit_overrides():
    options = SearchOptions.from_config(CONFIG, "beam")
    assert (
        options.method,
        options.beam_size,
        options.length_penalty,
        options.max_output_offset,
    ) == ("beam", 6, 1.0, 10)
    assert options.kwargs() == {"beam_size": 6, "length_penalty": 1.0, "max_output_offset": 10}
    # None is "not given" (an absl flag without a value): the config's value stays.
    overridden = SearchOptions.from_config(
        CONFIG, "beam", beam_size=2, length_penalty=None, num_return=2
    )
    assert overridden.kwargs() == {
        "beam_size": 2,
        "length_penalty": 1.0,
        "max_output_offset": 10,
        "num_return": 2,
    }
    sampling = SearchOptions.from_config(CONFIG, "sample", temperature=0.5, seed=3)
    assert sampling.kwargs() == {"max_output_offset": 10, "temperature": 0.5, "seed": 3}
    assert SearchOptions.from_config(CONFIG, "greedy").kwargs() == {"max_output_offset": 10}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 3


@pytest.mark.parametrize(
    "method, overrides, message",
    [
        ("beam", dict(beam_size=0), "beam_size must be a positive integer. Received: beam_size=0"),
        (
            "beam",
            dict(length_penalty=-0.1),
            "length_penalty must be a number >= 0. Received: length_penalty=-0.1",
        ),
        (
            "beam",
            dict(length_penalty=float("nan")),
            "length_penalty must be a number >= 0. Received: length_penalty=nan",
        ),
        (
            "beam",
            dict(max_output_offset=-1),
            "max_output_offset must be an integer >= 0. Received: max_output_offset=-1",
        ),
        (
            "beam",
            dict(num_return=7),
            "num_return must be in \\[1, beam_size\\]. Received: num_return=7, beam_size=6",
        ),
        (
            "sample",
            dict(temperature=0.0),
            "temperature must be a number > 0. Received: temperature=0.0",
        ),
        ("sample", dict(top_p=1.5), "top_p must be in \\(0, 1\\]. Received: top_p=1.5"),
        ("sample", dict(top_k=-2), "top_k must be an integer >= 0. Received: top_k=-2"),
        (
            "greedy",
            dict(beam_size=4),
            "beam_size does not apply to method='greedy'; it takes max_output_offset, max_length",
        ),
        ("beam", dict(top_k=5, seed=1), "seed, top_k do not apply to method='beam'"),
        ("beam", dict(beams=5), "Unknown search options \\['beams'\\]"),
        (
            "viterbi",
            {},
            "method must be one of \\['beam', 'greedy', 'sample'\\]. Received: method='viterbi'",
        ),
    ],
)
def test_bad_settings_are_named(method, overrides, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions.from_config(CONFIG, method, **overrides)


def test_the_config_and_the_search_refuse_what_search_options_refuse():
    with pytest.raises(
        ValueError, match="length_penalty must be a number >= 0. Received: length_penalty=-1.0"
    ):
        get_preset("tiny", length_penalty=-1.0)
    model = Transformer(
        get_preset(
            "tiny",
            vocabulary_size=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            hidden_dim=32,
            num_heads=2,
        )
    )
    with pytest.raises(
        ValueError, match="length_penalty must be a number >= 0. Received: length_penalty=-0.5"
    ):
        beam_search(model, [[5, 6, 3]], length_penalty=-0.5, max_length=4)
    with pytest.raises(ValueError, match="num_return must be in"):
        beam_search(model, [[5, 6, 3]], beam_size=2, num_return=3, max_length=4)


def test_best_hypotheses_takes_the_first_of_an_nbest_result():
    token_ids = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    scores = np.array([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])
    best_ids, best_scores = best_hypotheses(token_ids, scores)
    np.testing.assert_array_equal(best_ids, token_ids[:, 0])
    np.testing.assert_array_equal(best_scores, [-1.0, -0.5])
    texts = np.array([[b"a", b"b"], [b"c", b"d"]])
    assert best_hypotheses(texts, scores[:, :2])[0].tolist() == [b"a", b"c"]
    one_best = best_hypotheses(token_ids[:, 0], scores[:, 0])  # already one per sentence: unchanged
    np.testing.assert_array_equal(one_best[0], token_ids[:, 0])


def test_with_method_keeps_the_settings_and_drops_what_the_method_does_not_take():
    beam = SearchOptions.from_config(CONFIG, "beam", num_return=2, max_length=20)
    assert beam.with_method("greedy").kwargs() == {"max_output_offset": 10, "max_length": 20}
    assert beam.with_method("beam") == beam
    with pytest.raises(ValueError, match="method must be one of"):
        beam.with_method("viterbi")


# A run whose config is not the paper's: a script that ignores it decodes with 4 / 0.6.
RUN_CONFIG = get_preset("tiny", beam_size=2, length_penalty=1.0, max_output_offset=7)


def parse_search_flags(*argv, method=True, sampling=True):
    flag_values = flags.FlagValues()
    cli.define_search_flags(method=method, flag_values=flag_values)
    if sampling:
        cli.define_sampling_flags(flag_values=flag_values)
    flag_values(["script", *argv])
    return flag_values


def test_scripts_resolve_the_run_config_with_the_flags_given():
    resolved = cli.search_options(RUN_CONFIG, parse_search_flags())
    assert resolved == SearchOptions("beam", beam_size=2, length_penalty=1.0, max_output_offset=7)
    resolved = cli.search_options(
        RUN_CONFIG, parse_search_flags("--beam_size=3", "--max_output_offset=9")
    )
    assert (resolved.beam_size, resolved.length_penalty, resolved.max_output_offset) == (3, 1.0, 9)
    greedy = cli.search_options(RUN_CONFIG, parse_search_flags("--method=greedy"))
    assert greedy.kwargs() == {"max_output_offset": 7}
    sample = cli.search_options(
        RUN_CONFIG, parse_search_flags("--method=sample", "--top_k=5", "--seed=1")
    )
    assert sample.kwargs() == {"max_output_offset": 7, "top_k": 5, "seed": 1}
    # A beam-only script (export.py, benchmark_decode.py): no --method, no sampling flags.
    beam_only = cli.search_options(
        RUN_CONFIG,
        parse_search_flags("--length_penalty=0.2", method=False, sampling=False),
        method="beam",
    )
    assert (beam_only.beam_size, beam_only.length_penalty) == (2, 0.2)
    with pytest.raises(app.UsageError, match="beam_size does not apply to method='greedy'"):
        cli.search_options(RUN_CONFIG, parse_search_flags("--method=greedy", "--beam_size=3"))
    with pytest.raises(
        app.UsageError, match="beam_size must be a positive integer. Received: beam_size=0"
    ):
        cli.search_options(RUN_CONFIG, parse_search_flags("--beam_size=0"))


SEARCH_SCRIPTS = (
    "translate.py",
    "evaluate.py",
    "export.py",
    "score_checkpoints.py",
    "benchmark_decode.py",
)
SEARCH_SETTINGS = set(cli.SEARCH_FLAGS) | {"beam_size", "length_penalty", "max_output_offset"}


def _calls(tree):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


@pytest.mark.parametrize("script", SEARCH_SCRIPTS)
def test_every_search_script_resolves_its_settings_through_cli_search_options(script):
    """Each script calls `cli.search_options`, defines no search flag of its own (a default
    there would hide the run's config) and reads no search flag past it."""
    tree = ast.parse((REPO / "experiments" / script).read_text(encoding="utf-8"))
    called = {ast.unparse(call.func) for call in _calls(tree)}
    assert "cli.search_options" in called
    defined = {
        call.args[0].value
        for call in _calls(tree)
        if ast.unparse(call.func).startswith("flags.DEFINE")
        and call.args
        and isinstance(call.args[0], ast.Constant)
    }
    assert not defined & SEARCH_SETTINGS, (
        f"{script} defines {sorted(defined & SEARCH_SETTINGS)} itself"
    )
    read = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and ast.unparse(node.value) == "FLAGS"
        and node.attr in SEARCH_SETTINGS
    }
    assert not read, f"{script} reads --{', --'.join(sorted(read))} past cli.search_options"


def test_no_search_setting_is_written_as_a_literal_outside_options():
    """The scripts and the benchmark code pass search settings from `SearchOptions`, never
    a literal beam size, alpha or offset (as arguments or as defaults)."""
    settings = {"beam_size", "length_penalty", "max_output_offset"}
    paths = [REPO / "experiments" / name for name in (*SEARCH_SCRIPTS, "benchmark.py")]
    paths += sorted((REPO / "keras_transformer" / "benchmark").glob("*.py"))
    paths += [
        REPO / "keras_transformer" / "evaluation" / "evaluate.py",
        REPO / "keras_transformer" / "cli.py",
    ]
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for call in _calls(tree):
            found += [
                (path.name, k.arg)
                for k in call.keywords
                if k.arg in settings
                and isinstance(k.value, ast.Constant)
                and k.value.value is not None
            ]
        for function in (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)):
            arguments = function.args.args + function.args.kwonlyargs
            defaults = [None] * (
                len(function.args.args) - len(function.args.defaults)
            ) + function.args.defaults
            defaults += function.args.kw_defaults
            found += [
                (path.name, f"{function.name}({argument.arg}=...)")
                for argument, default in zip(arguments, defaults)
                if argument.arg in settings
                and isinstance(default, ast.Constant)
                and default.value is not None
            ]
    assert not found


def test_evaluate_script_decodes_with_the_run_config(trained_run, tmp_path):
    """One real script run on a run whose config says beam 2 and alpha 1.0."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    config_file = run / "config.json"
    payload = json.loads(config_file.read_text())
    payload["model"].update(beam_size=2, length_penalty=1.0, max_output_offset=7)
    config_file.write_text(json.dumps(payload))
    stdout = run_script(
        "evaluate.py", f"--model_dir={run}", "--split=test", "--max_sentences=2"
    ).stdout
    assert "method=beam, beam_size=2, length_penalty=1.0, max_output_offset=7" in stdout
