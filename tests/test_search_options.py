"""`SearchOptions`: the one home of the search settings, and the callers that build from it."""

import dataclasses

import numpy as np
import pytest

from keras_transformer import Transformer, get_preset
from keras_transformer.decoding import SearchOptions, beam_search, best_hypotheses, options_from_config
from keras_transformer.decoding import search_options

CONFIG = get_preset("tiny", beam_size=6, length_penalty=1.0, max_output_offset=10)


def test_from_config_takes_the_run_settings_and_explicit_overrides():
    options = SearchOptions.from_config(CONFIG, "beam")
    assert (options.method, options.beam_size, options.length_penalty, options.max_output_offset) == ("beam", 6, 1.0, 10)
    assert options.kwargs() == {"beam_size": 6, "length_penalty": 1.0, "max_output_offset": 10}
    # None is "not given" (an absl flag without a value): the config's value stays.
    overridden = SearchOptions.from_config(CONFIG, "beam", beam_size=2, length_penalty=None, num_return=2)
    assert overridden.kwargs() == {"beam_size": 2, "length_penalty": 1.0, "max_output_offset": 10, "num_return": 2}
    sampling = SearchOptions.from_config(CONFIG, "sample", temperature=0.5, seed=3)
    assert sampling.kwargs() == {"max_output_offset": 10, "temperature": 0.5, "seed": 3}
    assert SearchOptions.from_config(CONFIG, "greedy").kwargs() == {"max_output_offset": 10}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 3


def test_every_caller_builds_the_same_settings():
    for method in ("greedy", "beam", "sample"):
        assert options_from_config(CONFIG, method) == SearchOptions.from_config(CONFIG, method).kwargs()
        assert search_options(CONFIG, method) == SearchOptions.from_config(CONFIG, method).kwargs()


@pytest.mark.parametrize(
    "method, overrides, message",
    [
        ("beam", dict(beam_size=0), "beam_size must be a positive integer. Received: beam_size=0"),
        ("beam", dict(length_penalty=-0.1), "length_penalty must be a number >= 0. Received: length_penalty=-0.1"),
        ("beam", dict(length_penalty=float("nan")), "length_penalty must be a number >= 0. Received: length_penalty=nan"),
        ("beam", dict(max_output_offset=-1), "max_output_offset must be an integer >= 0. Received: max_output_offset=-1"),
        ("beam", dict(num_return=7), "num_return must be in \\[1, beam_size\\]. Received: num_return=7, beam_size=6"),
        ("sample", dict(temperature=0.0), "temperature must be a number > 0. Received: temperature=0.0"),
        ("sample", dict(top_p=1.5), "top_p must be in \\(0, 1\\]. Received: top_p=1.5"),
        ("sample", dict(top_k=-2), "top_k must be an integer >= 0. Received: top_k=-2"),
        ("greedy", dict(beam_size=4), "beam_size does not apply to method='greedy'; it takes max_output_offset, max_length"),
        ("beam", dict(top_k=5, seed=1), "seed, top_k do not apply to method='beam'"),
        ("beam", dict(beams=5), "Unknown search options \\['beams'\\]"),
        ("viterbi", {}, "method must be one of \\['beam', 'greedy', 'sample'\\]. Received: method='viterbi'"),
    ],
)
def test_bad_settings_are_named(method, overrides, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions.from_config(CONFIG, method, **overrides)


def test_the_config_and_the_search_refuse_what_search_options_refuse():
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0. Received: length_penalty=-1.0"):
        get_preset("tiny", length_penalty=-1.0)
    model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1, num_decoder_layers=1,
                                   hidden_dim=32, num_heads=2))
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0. Received: length_penalty=-0.5"):
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
