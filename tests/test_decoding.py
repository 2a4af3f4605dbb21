"""Search algorithms on real (tiny) Transformers: cache vs recompute, batching, seeds, XLA.

Two models: a randomly initialized one (seeded; most of its outputs run to their length
limit without EOS) and one trained for a few hundred steps to copy its source
(its outputs end with EOS at varied lengths, so they exercise finished hypotheses).
Exactness against exhaustive enumeration is in `test_decoding_search.py`.
"""

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, get_preset
from keras_transformer.decoding import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    beam_search,
    filter_logits,
    greedy_search,
    length_penalty,
    make_search_fn,
    recompute_beam_search,
    recompute_greedy_search,
    sample,
)

VOCABULARY_SIZE = 32
# Mixed source lengths (EOS-terminated, right-padded with PAD).
SOURCES = np.array(
    [
        [5, 6, 7, 3, 0, 0, 0],
        [8, 9, 10, 11, 12, 13, 3],
        [4, 3, 0, 0, 0, 0, 0],
        [20, 21, 22, 23, 3, 0, 0],
    ],
    np.int32,
)


def tiny_config(**overrides):
    return get_preset(
        "tiny",
        vocabulary_size=VOCABULARY_SIZE,
        num_encoder_layers=2,
        num_decoder_layers=2,
        hidden_dim=32,
        intermediate_dim=64,
        num_heads=2,
        **overrides,
    )


# The uncached step at position 0 attends over one key; Keras warns about a size-1 softmax.
pytestmark = pytest.mark.filterwarnings("ignore:You are using a softmax over axis -1")


@pytest.fixture(scope="module")
def random_model():
    # Untied output projection and pre-LN: a random model that emits varied tokens (a random
    # tied-embedding model mostly echoes its input token, so greedy repeats one token).
    keras.utils.set_random_seed(0)
    return Transformer(tiny_config(tie_output=False, normalize_first=True))


def copy_batch(rng, size, max_tokens=8):
    width = max_tokens + 1
    source = np.zeros((size, width), np.int32)
    target_in = np.zeros((size, width), np.int32)
    target_out = np.zeros((size, width), np.int32)
    for row in range(size):
        count = rng.integers(1, max_tokens + 1)
        tokens = rng.integers(4, VOCABULARY_SIZE, count)
        source[row, :count], source[row, count] = tokens, EOS_ID
        target_in[row, 0], target_in[row, 1 : count + 1] = BOS_ID, tokens
        target_out[row, :count], target_out[row, count] = tokens, EOS_ID
    return source, target_in, target_out


@pytest.fixture(scope="module")
def copy_model():
    keras.utils.set_random_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    source, target_in, target_out = copy_batch(np.random.default_rng(0), 64 * 100)  # 100 steps
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD_ID),
        jit_compile=False,
    )
    model.fit(
        {"source_ids": source, "target_ids": target_in},
        target_out,
        batch_size=64,
        epochs=1,
        verbose=0,
    )
    return model


def teacher_forced_log_prob(model, tokens, source):
    """log P(tokens | source) from one full decoder pass (PAD/BOS are never emitted)."""
    encoder_outputs, mask = model.encode(source[None])
    target_in = np.array([[BOS_ID] + tokens[:-1]], np.int32)
    log_probs = tf.nn.log_softmax(model.decode(target_in, encoder_outputs, mask), axis=-1)[
        0
    ].numpy()
    return float(sum(log_probs[position, token] for position, token in enumerate(tokens)))


def tokens_of(row):
    row = list(np.asarray(row))
    return (
        row[: row.index(EOS_ID) + 1]
        if EOS_ID in row
        else [token for token in row if token != PAD_ID]
    )


def test_copy_model_ends_sentences(copy_model):
    token_ids, _ = greedy_search(copy_model, SOURCES)
    ends = [EOS_ID in list(row) for row in token_ids.numpy()]
    assert sum(ends) >= 3, token_ids.numpy()


@pytest.mark.parametrize("model_name", ["random_model", "copy_model"])
def test_cached_greedy_equals_recompute(model_name, request):
    model = request.getfixturevalue(model_name)
    cached_ids, cached_scores = greedy_search(model, SOURCES, max_output_offset=8)
    recomputed_ids, recomputed_scores = recompute_greedy_search(model, SOURCES, max_output_offset=8)
    np.testing.assert_array_equal(cached_ids, recomputed_ids)
    np.testing.assert_allclose(cached_scores, recomputed_scores, rtol=1e-4, atol=1e-5)
    assert len(set(cached_ids.numpy().ravel().tolist()) - {PAD_ID}) > 3  # not a degenerate output


def test_cached_beam_equals_recompute(copy_model):
    cached = beam_search(copy_model, SOURCES, beam_size=4, num_return=4, max_output_offset=6)
    recomputed = recompute_beam_search(
        copy_model, SOURCES, beam_size=4, num_return=4, max_output_offset=6
    )
    np.testing.assert_array_equal(cached[0], recomputed[0])
    np.testing.assert_allclose(cached[1], recomputed[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_name", ["random_model", "copy_model"])
def test_beam_size_one_equals_greedy(model_name, request):
    model = request.getfixturevalue(model_name)
    greedy_ids, greedy_scores = greedy_search(model, SOURCES, max_output_offset=8)
    beam_ids, beam_scores = beam_search(
        model, SOURCES, beam_size=1, length_penalty=0.0, max_output_offset=8
    )
    np.testing.assert_array_equal(beam_ids[:, 0], greedy_ids)
    np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-6)


def test_output_conventions_and_scores(copy_model):
    alpha = 0.6
    token_ids, scores = beam_search(
        copy_model, SOURCES, beam_size=4, num_return=3, length_penalty=alpha, max_output_offset=6
    )
    assert token_ids.dtype == tf.int32 and scores.dtype == tf.float32
    assert token_ids.shape == (4, 3, SOURCES.shape[1] + 6)
    assert np.all(np.diff(scores.numpy(), axis=1) <= 0)  # n-best sorted, best first
    limits = (SOURCES != PAD_ID).sum(axis=1) + 6
    for sentence in range(len(SOURCES)):
        for rank in range(3):
            row = list(token_ids[sentence, rank].numpy())
            tokens = tokens_of(row)
            # finished hypotheses stay finished: after EOS only padding
            assert all(token == PAD_ID for token in row[len(tokens) :])
            assert PAD_ID not in tokens and BOS_ID not in tokens
            assert tokens[-1] == EOS_ID or len(tokens) == limits[sentence]
            # the score is the hypothesis' own log P / lp(|Y|), nothing added after EOS
            expected = teacher_forced_log_prob(copy_model, tokens, SOURCES[sentence])
            expected /= length_penalty(len(tokens), alpha).numpy()
            np.testing.assert_allclose(scores[sentence, rank], expected, rtol=1e-4, atol=1e-4)
    greedy_ids, greedy_scores = greedy_search(copy_model, SOURCES, max_output_offset=6)
    for sentence in range(len(SOURCES)):
        tokens = tokens_of(greedy_ids[sentence].numpy())
        expected = teacher_forced_log_prob(copy_model, tokens, SOURCES[sentence])
        np.testing.assert_allclose(greedy_scores[sentence], expected, rtol=1e-4, atol=1e-4)


def test_length_limits_per_sentence(random_model):
    # The random model rarely emits EOS, so most outputs run to their own limit.
    token_ids, _ = greedy_search(random_model, SOURCES, max_output_offset=3, max_length=9)
    assert token_ids.shape == (4, 9)  # static buffer
    limits = np.minimum((SOURCES != PAD_ID).sum(axis=1) + 3, 9)  # [7, 9, 5, 8]
    for row, limit in zip(token_ids.numpy(), limits):
        tokens = tokens_of(row)
        assert len(tokens) <= limit
        assert np.all(row[limit:] == PAD_ID)
    beam_ids, _ = beam_search(
        random_model, SOURCES, max_output_offset=3, max_length=9, num_return=2
    )
    assert beam_ids.shape == (4, 2, 9)
    for rows, limit in zip(beam_ids.numpy(), limits):
        assert np.all(rows[:, limit:] == PAD_ID)


@pytest.mark.parametrize("method", ["greedy", "beam"])
@pytest.mark.parametrize("model_name", ["random_model", "copy_model"])
def test_mixed_length_batch_equals_one_at_a_time(method, model_name, request):
    model = request.getfixturevalue(model_name)

    def search(source):
        if method == "greedy":
            return greedy_search(model, source, max_output_offset=6)
        token_ids, scores = beam_search(
            model, source, beam_size=3, num_return=2, max_output_offset=6
        )
        return token_ids, scores

    batch_ids, batch_scores = search(SOURCES)
    for sentence, source in enumerate(SOURCES):
        length = int((source != PAD_ID).sum())
        ids, scores = search(source[None, :length])  # alone, without padding
        width = ids.shape[-1]  # its own buffer: length + offset
        np.testing.assert_array_equal(ids[0], batch_ids[sentence][..., :width])
        assert np.all(batch_ids[sentence][..., width:].numpy() == PAD_ID)
        np.testing.assert_allclose(scores[0], batch_scores[sentence], rtol=1e-4, atol=1e-5)


def test_top_k_one_sampling_equals_greedy(random_model):
    greedy_ids, greedy_scores = greedy_search(random_model, SOURCES, max_output_offset=6)
    for seed in (0, 1):
        sampled_ids, sampled_scores = sample(
            random_model, SOURCES, top_k=1, seed=seed, max_output_offset=6
        )
        np.testing.assert_array_equal(sampled_ids, greedy_ids)
        np.testing.assert_allclose(sampled_scores, greedy_scores, rtol=1e-6)


def test_sampling_is_reproducible_by_seed(random_model):
    eager = sample(random_model, SOURCES, seed=7, max_output_offset=6)
    # in graph mode the seed can be a tensor input: one trace for every seed
    search = tf.function(
        lambda source, seed: sample(random_model, source, seed=seed, max_output_offset=6)
    )
    first = search(SOURCES, tf.constant(7))
    again = search(SOURCES, tf.constant(7))
    other = search(SOURCES, tf.constant(8))
    for outputs in (first, again):
        np.testing.assert_array_equal(outputs[0], eager[0])
        np.testing.assert_allclose(outputs[1], eager[1], rtol=1e-5)
    assert not np.array_equal(first[0], other[0])
    # seed=None: a fresh seed on every call, also when traced once
    unseeded = tf.function(lambda source: sample(random_model, source, max_output_offset=6))
    assert not np.array_equal(unseeded(SOURCES)[0], unseeded(SOURCES)[0])


def test_sampling_filters(random_model):
    logits = tf.math.log(tf.constant([[0.05, 0.5, 0.3, 0.15]]))
    kept = np.isfinite(filter_logits(logits, top_k=2).numpy())
    np.testing.assert_array_equal(kept, [[False, True, True, False]])
    kept = np.isfinite(filter_logits(logits, top_p=0.75).numpy())  # 0.5 + 0.3 reaches 0.75
    np.testing.assert_array_equal(kept, [[False, True, True, False]])
    kept = np.isfinite(filter_logits(logits, top_p=0.5).numpy())
    np.testing.assert_array_equal(kept, [[False, True, False, False]])
    kept = np.isfinite(filter_logits(logits, top_k=3, top_p=0.9).numpy())
    np.testing.assert_array_equal(kept, [[False, True, True, True]])
    # a tiny nucleus is greedy
    np.testing.assert_array_equal(
        sample(random_model, SOURCES, top_p=1e-6, seed=3, max_output_offset=4)[0],
        greedy_search(random_model, SOURCES, max_output_offset=4)[0],
    )


@pytest.mark.parametrize(
    "method, options",
    [
        ("greedy", {}),
        ("beam", {"beam_size": 4, "num_return": 2}),
        ("sample", {"seed": 5, "top_k": 10, "temperature": 0.8}),
    ],
)
def test_xla_matches_graph_and_eager(copy_model, method, options):
    options = dict(options, max_length=12, max_output_offset=4)
    eager = {"greedy": greedy_search, "beam": beam_search, "sample": sample}[method](
        copy_model, SOURCES, **options
    )
    graph = make_search_fn(copy_model, method, **options)(SOURCES)
    xla = make_search_fn(copy_model, method, jit_compile=True, **options)(SOURCES)
    for outputs in (graph, xla):
        np.testing.assert_array_equal(outputs["token_ids"], eager[0])
        np.testing.assert_allclose(outputs["scores"], eager[1], rtol=1e-4, atol=1e-5)


def test_cached_step_grows_its_cache_outside_xla_only(random_model):
    """Graph mode: a cache of the positions decoded so far (a beam reorder copies only those);
    XLA: the static buffer of L slots."""
    from keras_transformer.decoding.steps import CachedStep

    step = CachedStep(random_model)

    def self_cache_lengths(jit_compile):
        @tf.function(jit_compile=jit_compile)
        def lengths(source_ids):
            state = step.initialize(source_ids, 12, num_copies=2)
            state = step.reorder(
                step.step(state, tf.ones([2 * len(SOURCES), 13], tf.int32), tf.constant(0))[1],
                tf.range(2 * len(SOURCES)),
            )
            return {name: tf.shape(tensor)[2] for name, tensor in state["cache"][0]["self"].items()}

        return {name: int(length) for name, length in lengths(SOURCES).items()}

    assert self_cache_lengths(False) == {"past_key": 1, "past_value": 1}
    assert self_cache_lengths(True) == {"key": 12, "value": 12}


def test_xla_recompute_baseline(copy_model):
    cached = make_search_fn(copy_model, "greedy", jit_compile=True, max_length=12)(SOURCES)
    recomputed = make_search_fn(
        copy_model, "greedy", use_cache=False, jit_compile=True, max_length=12
    )(SOURCES)
    np.testing.assert_array_equal(cached["token_ids"], recomputed["token_ids"])


def test_search_fn_is_traced_once_for_any_shape(copy_model):
    translate = make_search_fn(copy_model, "beam", max_length=10)
    first = translate(SOURCES)
    second = translate(SOURCES[[0, 2], :5])  # fewer sentences, less padding
    assert first["token_ids"].shape == (4, 1, 10) and second["token_ids"].shape == (2, 1, 10)
    np.testing.assert_array_equal(second["token_ids"], tf.gather(first["token_ids"], [0, 2]))
    assert translate.experimental_get_tracing_count() == 1
    # max_length=None: the buffer follows the source width (a dynamic shape in the graph)
    flexible = make_search_fn(copy_model, "greedy", max_output_offset=3)
    assert flexible(SOURCES)["token_ids"].shape == (4, 7 + 3)
    assert flexible(SOURCES[[0, 2, 3], :5])["token_ids"].shape == (3, 5 + 3)


def test_search_runs_in_a_saved_model(copy_model, tmp_path):
    module = tf.Module()
    module.model = copy_model
    module.translate = make_search_fn(copy_model, "beam", beam_size=4, max_length=12)
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.translate})
    loaded = tf.saved_model.load(str(tmp_path))
    outputs = loaded.signatures["serving_default"](source_ids=tf.constant(SOURCES))
    expected = module.translate(SOURCES)
    np.testing.assert_array_equal(outputs["token_ids"], expected["token_ids"])
    np.testing.assert_allclose(outputs["scores"], expected["scores"], rtol=1e-5)


def test_mixed_precision_model():
    keras.utils.set_random_seed(0)
    model = Transformer(tiny_config(tie_output=False, normalize_first=True), dtype="mixed_bfloat16")
    outputs = make_search_fn(model, "beam", beam_size=2, num_return=2, max_length=8)(SOURCES)
    assert outputs["token_ids"].shape == (4, 2, 8) and outputs["scores"].dtype == tf.float32
    assert np.all(np.isfinite(outputs["scores"].numpy()))
    token_ids, scores = greedy_search(model, SOURCES, max_length=8)
    assert token_ids.shape == (4, 8) and scores.dtype == tf.float32


def test_learned_positions_cap_the_buffer():
    keras.utils.set_random_seed(2)
    model = Transformer(tiny_config(positional="learned", max_length=10))
    token_ids, _ = greedy_search(model, SOURCES, max_output_offset=50)
    assert token_ids.shape == (4, 10)
    with pytest.raises(ValueError, match="max_length"):
        greedy_search(model, SOURCES, max_length=11)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: beam_search(m, SOURCES, beam_size=0), "beam_size"),
        (lambda m: beam_search(m, SOURCES, beam_size=2, num_return=3), "num_return"),
        (lambda m: beam_search(m, SOURCES, length_penalty=-1.0), "length_penalty"),
        (lambda m: greedy_search(m, SOURCES, max_length=0), "max_length"),
        (lambda m: greedy_search(m, SOURCES, max_output_offset=-1), "max_output_offset"),
        (lambda m: sample(m, SOURCES, temperature=0.0), "temperature"),
        (lambda m: sample(m, SOURCES, top_k=-1), "top_k"),
        (lambda m: sample(m, SOURCES, top_p=0.0), "top_p"),
        (lambda m: make_search_fn(m, "viterbi"), "method"),
        (lambda m: make_search_fn(m, "greedy", beam_size=4), "beam_size"),
    ],
)
def test_invalid_arguments_raise(random_model, call, message):
    with pytest.raises(ValueError, match=message):
        call(random_model)


def test_docs_quick_start_runs():
    """The first ```python block of docs/decoding.md (the quick start) runs as written."""
    doc = Path(__file__).resolve().parents[1] / "docs" / "decoding.md"
    block = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.DOTALL)[0]
    namespace = {}
    exec(compile(block, str(doc), "exec"), namespace)
    assert tuple(namespace["outputs"]["token_ids"].shape) == (2, 1, 64)
    assert tuple(namespace["token_ids"].shape) == (2, 6 + 10)
    assert tuple(namespace["nbest_ids"].shape) == (2, 4, 6 + 10)
    assert tuple(namespace["samples"].shape) == (2, 6 + 10)


class _RecordingStep:
    """Delegates to a step object and records how many decoder rows every step computes."""

    def __init__(self, step, can_drop_sentences):
        self.inner, self.can_drop_sentences, self.rows = step, can_drop_sentences, []

    def initialize(self, source_ids, buffer_size, num_copies=1):
        return self.inner.initialize(source_ids, buffer_size, num_copies)

    def step(self, state, target_ids, index):
        self.rows.append(int(target_ids.shape[0]))
        return self.inner.step(state, target_ids, index)

    def reorder(self, state, indices, **kwargs):
        return self.inner.reorder(state, indices, **kwargs)


class _UnsharedCrossCache:
    """A model whose decoder wants encoder-decoder keys/values tiled to every beam row."""

    supports_shared_cross_cache = False

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.mark.parametrize("kind", ["cached", "cached_tiled_cross", "recompute"])
def test_beam_search_stops_computing_done_sentences(copy_model, kind):
    from keras_transformer.decoding.steps import CachedStep, RecomputeStep

    def make():
        return {
            "cached": lambda: CachedStep(copy_model),
            "cached_tiled_cross": lambda: CachedStep(_UnsharedCrossCache(copy_model)),
            "recompute": lambda: RecomputeStep(copy_model),
        }[kind]()

    options = dict(beam_size=3, num_return=2, max_output_offset=6)
    dropping, keeping = _RecordingStep(make(), True), _RecordingStep(make(), False)
    dropped_ids, dropped_scores = beam_search(dropping, SOURCES, **options)
    kept_ids, kept_scores = beam_search(keeping, SOURCES, **options)
    np.testing.assert_array_equal(dropped_ids, kept_ids)
    np.testing.assert_allclose(dropped_scores, kept_scores, rtol=1e-5, atol=1e-6)
    assert set(keeping.rows) == {12}  # 4 sentences x 3 beams, every step
    # Done sentences leave the working set: fewer rows, never more, never a sentence split.
    assert dropping.rows[0] == 12 and dropping.rows[-1] < 12
    assert all(a >= b and b % 3 == 0 for a, b in zip(dropping.rows, dropping.rows[1:]))
    assert sum(dropping.rows) < sum(keeping.rows)
