"""Exactness tests of the search algorithms against exhaustive enumeration.

The model here is a small *n-gram table model* that implements the same interface as
`Transformer` (`encode`, `init_cache`, `decode_step`, `decode`): its next-token
distribution is a hand-set or seeded table indexed by the last two tokens of the prefix.
The older of the two tokens is read back from the self-attention cache slot, so a beam
search that reorders its cache wrongly produces wrong probabilities. Because every
sequence probability is known in closed form, the tests compare against exhaustive
enumeration of all outputs.
"""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    CachedStep,
    EnsembleStep,
    beam_search,
    greedy_search,
    length_penalty,
    recompute_beam_search,
    recompute_greedy_search,
)

A, B, C = 4, 5, 6
VOCABULARY_SIZE = 7
OUTPUT_TOKENS = (EOS_ID, A, B, C)


class TrigramTableModel:
    """p(y_t | y_<t) = table[y_{t-2}, y_{t-1}], with y_0 = BOS and y_{-1} = PAD.

    Cache per layer (one layer): `"self"` holds the decoder input tokens written at their
    positions (as float "keys" `(B, 1, L, 1)`), `"cross"` the source ids.
    """

    def __init__(self, probabilities):
        probabilities = np.asarray(probabilities, np.float64)  # (V, V, V)
        with np.errstate(divide="ignore"):
            self.table = tf.constant(np.log(probabilities), tf.float32)

    def encode(self, source_ids):
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        return tf.cast(source_ids[:, :, None], tf.float32), tf.not_equal(source_ids, PAD_ID)

    def init_cache(self, encoder_outputs, max_length):
        batch_size = tf.shape(encoder_outputs)[0]
        history = tf.zeros([batch_size, 1, max_length, 1], tf.float32)
        memory = encoder_outputs[:, None]
        return (
            {"self": {"key": history, "value": history}, "cross": {"key": memory, "value": memory}},
        )

    def decode_step(self, token_ids, cache, cache_index, source_padding_mask):
        token_ids = tf.convert_to_tensor(token_ids, tf.int32)  # (B, 1)
        history = cache[0]["self"]["key"]  # (B, 1, L, 1)
        history = tf.tensor_scatter_nd_update(
            tf.transpose(history, [2, 0, 1, 3]),
            [[cache_index]],
            tf.cast(token_ids, tf.float32)[None, :, :, None],
        )
        history = tf.transpose(history, [1, 2, 0, 3])
        previous = tf.cast(
            tf.gather(history[:, 0, :, 0], tf.maximum(cache_index - 1, 0), axis=1), tf.int32
        )  # (B,)
        previous = tf.where(cache_index > 0, previous, PAD_ID)
        logits = tf.gather_nd(self.table, tf.stack([previous, token_ids[:, 0]], axis=-1))  # (B, V)
        new_cache = ({"self": {"key": history, "value": history}, "cross": cache[0]["cross"]},)
        return logits[:, None, :], new_cache

    def decode(self, target_ids, encoder_outputs, source_padding_mask):
        target_ids = tf.convert_to_tensor(target_ids, tf.int32)  # (B, T)
        previous = tf.pad(target_ids[:, :-1], [[0, 0], [1, 0]])  # (B, T), PAD before BOS
        return tf.gather_nd(self.table, tf.stack([previous, target_ids], axis=-1))  # (B, T, V)


def next_token_table(rows):
    """A (V, V, V) table from `{(prev2 or None, prev1): {token: probability}}` rows.

    `prev2=None` makes the row apply for every older token.
    """
    table = np.zeros((VOCABULARY_SIZE,) * 3)
    table[:, :, EOS_ID] = 1.0  # unused contexts: a valid distribution
    for (older, last), distribution in rows.items():
        olders = range(VOCABULARY_SIZE) if older is None else [older]
        for prev2 in olders:
            table[prev2, last] = 0.0
            for token, probability in distribution.items():
                table[prev2, last, token] = probability
    return table


def random_table(seed):
    rng = np.random.default_rng(seed)
    table = np.zeros((VOCABULARY_SIZE,) * 3)
    for prev2, prev1 in itertools.product(range(VOCABULARY_SIZE), repeat=2):
        table[prev2, prev1, list(OUTPUT_TOKENS)] = rng.dirichlet(np.full(len(OUTPUT_TOKENS), 0.7))
    return table


def sequence_log_prob(table, tokens):
    log_prob, prev2, prev1 = 0.0, PAD_ID, BOS_ID
    for token in tokens:
        log_prob += math.log(table[prev2, prev1, token])
        prev2, prev1 = prev1, token
    return log_prob


def exhaustive(table, limit, alpha):
    """All outputs of at most `limit` tokens (ended by EOS or cut at the limit), best first."""
    results = []

    def extend(prefix, log_prob, prev2, prev1):
        for token in OUTPUT_TOKENS:
            probability = table[prev2, prev1, token]
            if probability <= 0:
                continue
            tokens = prefix + [token]
            total = log_prob + math.log(probability)
            if token == EOS_ID or len(tokens) == limit:
                results.append((total / ((5 + len(tokens)) / 6) ** alpha, tokens))
            else:
                extend(tokens, total, prev1, token)

    extend([], 0.0, PAD_ID, BOS_ID)
    return sorted(results, key=lambda result: -result[0])


def unpad(token_ids):
    return [int(token) for token in token_ids if token != PAD_ID]


# A table where greedy goes wrong: A is the most probable first token, but after A
# nothing is likely; B then EOS is the most probable sentence.
GREEDY_TRAP = next_token_table(
    {
        (None, BOS_ID): {A: 0.5, B: 0.4, EOS_ID: 0.1},
        (None, A): {A: 0.36, B: 0.34, EOS_ID: 0.3},
        (None, B): {EOS_ID: 0.9, A: 0.05, B: 0.05},
        (None, C): {EOS_ID: 1.0},
    }
)


def test_beam_finds_the_exhaustive_best_where_greedy_does_not():
    model = TrigramTableModel(GREEDY_TRAP)
    source = [[A, EOS_ID]]  # source length 2, offset 4: at most 6 output tokens
    limit = 6
    for alpha in (0.0, 0.6):
        best_score, best_tokens = exhaustive(GREEDY_TRAP, limit, alpha)[0]
        assert best_tokens == [B, EOS_ID]
        greedy_ids, greedy_scores = greedy_search(model, source, max_output_offset=4)
        greedy_tokens = unpad(greedy_ids[0].numpy())
        assert greedy_tokens == [A] * limit  # never sees a likely EOS; cut at the limit
        np.testing.assert_allclose(
            greedy_scores[0], sequence_log_prob(GREEDY_TRAP, greedy_tokens), rtol=1e-5
        )
        beam_ids, beam_scores = beam_search(
            model, source, beam_size=2, length_penalty=alpha, max_output_offset=4
        )
        assert unpad(beam_ids[0, 0].numpy()) == best_tokens
        np.testing.assert_allclose(beam_scores[0, 0], best_score, rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_large_beam_returns_the_exhaustive_n_best(seed, alpha):
    table = random_table(seed)
    model = TrigramTableModel(table)
    limit = 6
    expected = exhaustive(table, limit, alpha)[:5]
    # 4 tokens per step from at most 3^5 alive prefixes: 1024 beams keep every candidate.
    token_ids, scores = beam_search(
        model,
        [[A, EOS_ID]],
        beam_size=1024,
        length_penalty=alpha,
        max_output_offset=4,
        num_return=5,
    )
    assert [unpad(row) for row in token_ids[0].numpy()] == [tokens for _, tokens in expected]
    np.testing.assert_allclose(scores[0].numpy(), [score for score, _ in expected], rtol=1e-5)


@pytest.mark.parametrize("seed", [3, 4])
def test_small_beam_scores_are_exact_and_never_beat_exhaustive(seed):
    table = random_table(seed)
    model = TrigramTableModel(table)
    alpha = 0.6
    best_score = exhaustive(table, 6, alpha)[0][0]
    token_ids, scores = beam_search(
        model, [[A, EOS_ID]], beam_size=4, length_penalty=alpha, max_output_offset=4, num_return=4
    )
    scores = scores[0].numpy()
    assert np.all(np.diff(scores) <= 0)  # best first
    assert scores[0] <= best_score + 1e-6
    for row, score in zip(token_ids[0].numpy(), scores):
        tokens = unpad(row)
        expected = sequence_log_prob(table, tokens) / length_penalty(len(tokens), alpha).numpy()
        np.testing.assert_allclose(score, expected, rtol=1e-5)


def test_length_penalty_changes_the_ranking_as_the_formula_says():
    table = next_token_table(
        {
            (None, BOS_ID): {EOS_ID: 0.5, A: 0.5},
            (None, A): {EOS_ID: 0.9, A: 0.1},
        }
    )
    model = TrigramTableModel(table)
    short, long = [EOS_ID], [A, EOS_ID]
    log_p_short, log_p_long = math.log(0.5), math.log(0.5 * 0.9)
    for alpha, expected_order in (
        (0.0, [short, long]),
        (0.6, [short, long]),
        (1.0, [long, short]),
        (2.0, [long, short]),
    ):
        expected_scores = {
            tuple(short): log_p_short / ((5 + 1) / 6) ** alpha,  # lp(1) = 1
            tuple(long): log_p_long / ((5 + 2) / 6) ** alpha,
        }
        token_ids, scores = beam_search(
            model, [[A, EOS_ID]], beam_size=4, length_penalty=alpha, num_return=2
        )
        assert [unpad(row) for row in token_ids[0].numpy()] == expected_order, alpha
        np.testing.assert_allclose(
            scores[0].numpy(), [expected_scores[tuple(t)] for t in expected_order], rtol=1e-6
        )


def test_beam_size_one_without_length_penalty_is_greedy():
    for seed in range(5):
        model = TrigramTableModel(random_table(seed))
        source = [[A, B, EOS_ID, 0], [C, EOS_ID, 0, 0]]
        greedy_ids, greedy_scores = greedy_search(model, source, max_output_offset=6)
        beam_ids, beam_scores = beam_search(
            model, source, beam_size=1, length_penalty=0.0, max_output_offset=6
        )
        np.testing.assert_array_equal(beam_ids[:, 0], greedy_ids)
        np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-6)


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_cached_beam_follows_its_parents_like_recompute(seed):
    model = TrigramTableModel(random_table(seed))
    source = [[A, B, C, EOS_ID], [A, EOS_ID, 0, 0]]
    cached = beam_search(model, source, beam_size=4, num_return=4, max_output_offset=5)
    recomputed = recompute_beam_search(
        model, source, beam_size=4, num_return=4, max_output_offset=5
    )
    np.testing.assert_array_equal(cached[0], recomputed[0])
    np.testing.assert_allclose(cached[1], recomputed[1], rtol=1e-6)
    cached = greedy_search(model, source, max_output_offset=5)
    recomputed = recompute_greedy_search(model, source, max_output_offset=5)
    np.testing.assert_array_equal(cached[0], recomputed[0])


class CountingStep(CachedStep):
    """A cached step that counts how often it runs (eagerly, the loop body is Python)."""

    def __init__(self, model):
        super().__init__(model)
        self.calls = 0

    def step(self, state, target_ids, index):
        self.calls += 1
        return super().step(state, target_ids, index)


def test_beam_search_stops_early_when_no_alive_beam_can_win():
    # EOS is very likely at once; every longer output is much worse.
    table = next_token_table(
        {(None, BOS_ID): {EOS_ID: 0.9, A: 0.1}, (None, A): {A: 0.9, EOS_ID: 0.1}}
    )
    step = CountingStep(TrigramTableModel(table))
    token_ids, scores = beam_search(
        step, [[A, EOS_ID]], beam_size=2, length_penalty=0.6, max_output_offset=50
    )
    assert unpad(token_ids[0, 0].numpy()) == [EOS_ID]
    np.testing.assert_allclose(scores[0, 0], math.log(0.9), rtol=1e-6)
    # After the first step, [EOS] is finished with log(0.9) / lp(1) = -0.105, and the best
    # an alive hypothesis can reach is log(0.1) / lp(2 + 50) = -2.303 / 3.86 = -0.60: stop.
    assert step.calls == 1
    assert token_ids.shape == (1, 1, 52)


def test_hypotheses_cut_at_the_length_limit_are_scored_at_that_length():
    table = next_token_table({(None, BOS_ID): {A: 1.0}, (None, A): {A: 0.99, EOS_ID: 0.01}})
    model = TrigramTableModel(table)
    token_ids, scores = beam_search(
        model, [[A, B, EOS_ID], [A, EOS_ID, 0]], beam_size=2, max_output_offset=1, max_length=5
    )
    # limits: min(3 + 1, 5) = 4 and min(2 + 1, 5) = 3 tokens; no EOS at the end
    assert unpad(token_ids[0, 0].numpy()) == [A] * 4
    assert unpad(token_ids[1, 0].numpy()) == [A] * 3
    np.testing.assert_allclose(scores[0, 0], 3 * math.log(0.99) / ((5 + 4) / 6) ** 0.6, rtol=1e-5)
    np.testing.assert_allclose(scores[1, 0], 2 * math.log(0.99) / ((5 + 3) / 6) ** 0.6, rtol=1e-5)


def test_finished_hypotheses_are_never_extended():
    table = random_table(11)
    model = TrigramTableModel(table)
    token_ids, scores = beam_search(
        model, [[A, B, C, EOS_ID]] * 2, beam_size=4, num_return=4, max_output_offset=6
    )
    for row, score in zip(
        token_ids.numpy().reshape(-1, token_ids.shape[-1]), scores.numpy().ravel()
    ):
        tokens = list(row)
        if EOS_ID in tokens:
            end = tokens.index(EOS_ID) + 1
            assert all(token == PAD_ID for token in tokens[end:])
        else:
            end = len(unpad(tokens))
            assert end == 4 + 6  # only a hypothesis cut at its limit may lack EOS
        assert PAD_ID not in tokens[:end] and BOS_ID not in tokens[:end]
        expected = sequence_log_prob(table, tokens[:end]) / ((5 + end) / 6) ** 0.6
        np.testing.assert_allclose(score, expected, rtol=1e-5)


def table_ensemble(tables):
    """The step of an ensemble of table models."""
    return EnsembleStep([CachedStep(TrigramTableModel(table)) for table in tables])


# The mean of trigram tables is a trigram table: an ensemble of table models searches it.
@pytest.mark.parametrize("seeds", [(8, 9), (10, 11, 12)])
def test_an_ensemble_returns_the_exhaustive_n_best_of_its_mean_distribution(seeds):
    tables = [random_table(seed) for seed in seeds]
    mean = np.mean(tables, axis=0)
    alpha = 0.6
    expected = exhaustive(mean, 6, alpha)[:5]
    token_ids, scores = beam_search(
        table_ensemble(tables),
        [[A, EOS_ID]],
        beam_size=1024,
        length_penalty=alpha,
        max_output_offset=4,
        num_return=5,
    )
    assert [unpad(row) for row in token_ids[0].numpy()] == [tokens for _, tokens in expected]
    np.testing.assert_allclose(scores[0].numpy(), [score for score, _ in expected], rtol=1e-5)


def test_an_ensemble_searches_a_batch_as_the_model_of_its_mean_distribution():
    # Sentences of different lengths finish at different steps and leave the batch.
    tables = [random_table(seed) for seed in (13, 14)]
    mean = TrigramTableModel(np.mean(tables, axis=0))
    source = [[A, B, C, EOS_ID], [A, EOS_ID, 0, 0], [C, C, EOS_ID, 0]]
    for search, options in ((beam_search, dict(beam_size=4, num_return=4)), (greedy_search, {})):
        found = search(table_ensemble(tables), source, max_output_offset=5, **options)
        expected = search(mean, source, max_output_offset=5, **options)
        np.testing.assert_array_equal(found[0], expected[0])
        np.testing.assert_allclose(found[1], expected[1], rtol=1e-5)
