"""Step functions: how a search gets next-token logits from a model.

Shape letters: B batch, K copies per sentence (beam size), N = B * K rows, S source length,
L output buffer length, V vocabulary size.

The search algorithms (`greedy_search`, `sample`, `beam_search`) are written once against
this small interface and never call the model directly. `CachedStep` is `keras.ops` and
runs on every Keras backend; `RecomputeStep` and `shortlist.ShortlistStep` need
TensorFlow.

* `initialize(source_ids, buffer_size, num_copies)` -> `state`: encodes the source once
  and returns a nested structure of tensors whose leading axis is `N = B * num_copies`
  (row `b * num_copies + k` is copy `k` of sentence `b`).
* `step(state, target_ids, index)` -> `(logits (N, V) float32, state)`: the next-token
  logits at decoder position `index`, given the decoder inputs `target_ids (N, L + 1)`
  (BOS at slot 0; slots `<= index` hold the prefix).
* `reorder(state, indices)` -> `state`: follow the beam parents; `indices (N,)` picks,
  for every new row, the row it continues. Indices never cross sentences.

A step that sets `can_drop_sentences = True` also takes `reorder(state, indices,
sentences)`: `sentences (A',)` lists the sentences (positions in the current rows'
sentence order) that go on, `indices (A' * K,)` their new rows; beam search then stops
computing the sentences that are done.

`CachedStep` feeds one token per step through `model.decode_step` with the key/value
cache from `model.init_cache`; `RecomputeStep` re-runs the whole decoder
(`model.decode`) over the prefix every step, the uncached baseline.

A state may hold tensors that grow along an axis from step to step (a growing cache, on
TensorFlow outside XLA); the searches' loop (`search_loop`: a `tf.while_loop` on
TensorFlow) takes its shape invariants from `loop_shape_invariants`.

A model only needs `encode`, `init_cache` and `decode_step` (cached) or `encode` and
`decode` (recompute), with the signatures of `keras_transformer.Transformer`. A model that
takes extra inputs (`models.parsing.ParsingTransformer`'s word positions) gives them through
two hooks, `source_inputs(source_ids)` (once per source, tiled to the copies) and
`prefix_inputs(target_ids, index)` (every cached step); the steps pass them on by keyword
(`model_source_inputs`, `model_prefix_inputs`) and know nothing of what they hold.
"""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.backends import require_tensorflow
from keras_transformer.layers.attention_cache import CACHE_LENGTH_AXIS, GROWING_CACHE_KEYS
from keras_transformer.layers.tracing import in_xla_context


def tile_rows(tensor, num_copies):
    """Repeat every row `num_copies` times along axis 0: `(B, ...)` -> `(B * K, ...)`."""
    if num_copies == 1:
        return tensor
    return ops.repeat(tensor, num_copies, axis=0)


# The name scope of the cache's gathers in a beam step (`benchmark.profile` finds them by it).
REORDER_SCOPE = "reorder_cache"


def reorder_cache(cache, indices):
    """Gather every tensor of a decoder cache along axis 0 by `indices`.

    Sub-structures under a `"cross"` key (encoder-decoder keys/values) are left alone:
    they are identical for all beams of a sentence and `indices` never cross sentences,
    so gathering them would only copy memory.

    A growing cache (`CachedStep` outside XLA) holds only the positions decoded so far,
    so this copies `t` positions per row at step `t`; a preallocated `(N, H, L, D)`
    buffer (under XLA) is gathered whole, `L` slots per row. The gathers sit under the
    name scope `REORDER_SCOPE` (the profile's "beam reorder" counts them by it).
    """
    with keras.name_scope(REORDER_SCOPE):
        return map_cache(cache, lambda tensor: ops.take(tensor, indices, axis=0), cross=False)


def shares_cross_cache(model):
    """Whether `model.decode_step` accepts encoder-decoder caches (and source masks) with
    one row per sentence while the tokens have one row per copy (see `CachedStep`)."""
    return bool(getattr(model, "supports_shared_cross_cache", False))


def model_source_inputs(model, source_ids):
    """The extra inputs `model.decode` / `decode_step` take from the source
    (`Transformer.source_inputs`): a dict, empty for a model without the hook."""
    hook = getattr(model, "source_inputs", None)
    return hook(source_ids) if hook is not None else {}


def model_prefix_inputs(model, target_ids, index):
    """The extra inputs `model.decode_step` takes from the prefix at step `index`
    (`Transformer.prefix_inputs`): a dict, empty for a model without the hook."""
    hook = getattr(model, "prefix_inputs", None)
    return hook(target_ids, index) if hook is not None else {}


def _shares_growing_cache(model):
    """Whether `model.init_cache(encoder_outputs, None)` gives caches that grow with each
    `decode_step` (see `Transformer.init_cache`)."""
    return bool(getattr(model, "supports_growing_cache", False))


def loop_shapes_may_change():
    """Whether a search loop's tensors may change shape between iterations (a cache that
    grows, sentences that leave the batch): on TensorFlow outside XLA. JAX's
    `lax.while_loop` and XLA need static shapes; PyTorch takes the static path too."""
    return keras.backend.backend() == "tensorflow" and not in_xla_context()


def loop_shape_invariants(state, rows_vary=False):
    """The `tf.while_loop` shape invariants of a step's `state`.

    Args:
        state: the nested state of a step object (`initialize` / `step`).
        rows_vary: whether the leading axis changes between iterations (sentences leave
            the working set).

    Returns:
        `state`'s structure of `tf.TensorShape`s: each tensor's own shape, with axis 0
        unknown when `rows_vary`, and the length axis of growing caches
        (`layers.attention_cache.GROWING_CACHE_KEYS`) unknown.
    """

    def invariant(structure, growing=False):
        if isinstance(structure, dict):
            return {
                key: invariant(value, key in GROWING_CACHE_KEYS) for key, value in structure.items()
            }
        if isinstance(structure, (list, tuple)):
            return type(structure)(invariant(value) for value in structure)
        dims = list(structure.shape)
        if rows_vary:
            dims[0] = None
        if growing:
            dims[CACHE_LENGTH_AXIS] = None
        return tf.TensorShape(dims)

    return invariant(state)


def search_loop(cond, body, loop_vars, rows_vary=None):
    """The searches' loop: `ops.while_loop(cond, body, loop_vars)`, and on TensorFlow a
    `tf.while_loop` with `loop_shape_invariants`, so that a growing cache may grow and,
    where `rows_vary[i]` is True, loop variable `i` may lose rows (sentences that leave
    the working set). Returns the final `loop_vars` (a tuple)."""
    if keras.backend.backend() != "tensorflow":
        return tuple(ops.while_loop(cond, body, loop_vars))
    rows_vary = rows_vary or (False,) * len(loop_vars)
    invariants = tuple(loop_shape_invariants(var, vary) for var, vary in zip(loop_vars, rows_vary))
    return tuple(tf.while_loop(cond, body, loop_vars, shape_invariants=invariants))


def _gather_rows(structure, rows):
    """Gather every tensor of `structure` along axis 0 by `rows`."""
    return keras.tree.map_structure(lambda tensor: ops.take(tensor, rows, axis=0), structure)


class CachedStep:
    """Incremental decoding: one new token per step, self-attention keys/values cached.

    The cache comes from `model.init_cache(encoder_outputs, L)`: a self-attention buffer
    per layer and the encoder-decoder keys/values, computed once per source. The buffer
    grows by one position per step when the model supports it
    (`supports_growing_cache = True`, as `Transformer`) and the search runs on TensorFlow
    outside XLA: each step and each beam reorder then copies only the positions decoded so
    far. Otherwise (XLA, JAX's loop: static shapes; PyTorch likewise) it is preallocated
    with `L` slots and written at `index` by `model.decode_step`.
    The self-attention buffers are tiled to the `K` copies; the encoder-decoder part
    (under `"cross"`) and the source mask too, unless the model sets
    `supports_shared_cross_cache = True` (as `Transformer` does): then they keep one row
    per sentence and the `K` copies share it.

    Args:
        model: exposes `encode`, `init_cache` and `decode_step` like `Transformer`.
    """

    can_drop_sentences = True

    def __init__(self, model):
        self.model = model

    def initialize(self, source_ids, buffer_size, num_copies=1):
        encoder_outputs, source_mask = self.model.encode(source_ids)  # (B, S, D), (B, S)
        grows = _shares_growing_cache(self.model) and loop_shapes_may_change()
        cache = self.model.init_cache(
            encoder_outputs, None if grows else buffer_size
        )  # once per source
        shared = shares_cross_cache(self.model)

        def tile(structure):
            return keras.tree.map_structure(lambda tensor: tile_rows(tensor, num_copies), structure)

        if shared:  # tile only the self-attention buffers
            cache = map_cache(cache, tile, cross=False)
        else:
            cache = tile(cache)  # (N, ...): row b * K + k is copy k of sentence b
            source_mask = tile_rows(source_mask, num_copies)
        state = {"cache": cache, "source_mask": source_mask}
        inputs = model_source_inputs(self.model, source_ids)
        if inputs:  # (N, ...): per copy, never shared
            state["inputs"] = tile(inputs)
        return state

    def step(self, state, target_ids, index):
        tokens = ops.take(target_ids, index[None], axis=1)  # (N, 1)
        logits, cache = self.model.decode_step(
            tokens,
            state["cache"],
            index,
            state["source_mask"],
            **state.get("inputs", {}),
            **model_prefix_inputs(self.model, target_ids, index),
            **self.output_kwargs(state),
        )
        return ops.cast(logits[:, 0, :], "float32"), {**state, "cache": cache}

    def output_kwargs(self, state):
        """Extra `decode_step` arguments that choose the logits' tokens (`shortlist.ShortlistStep`)."""
        return {}

    def reorder(self, state, indices, sentences=None):
        cache, source_mask = reorder_cache(state["cache"], indices), state["source_mask"]
        inputs = state.get("inputs")
        if sentences is not None:
            # The cross keys/values and the source mask have one row per sentence when
            # shared, else one per copy like the self-attention buffers.
            rows = sentences if shares_cross_cache(self.model) else indices
            with keras.name_scope(REORDER_SCOPE):
                cache = map_cache(cache, lambda cross: _gather_rows(cross, rows), cross=True)
            source_mask = ops.take(source_mask, rows, axis=0)
            if inputs is not None:  # never shared
                inputs = _gather_rows(inputs, indices)
        state = {"cache": cache, "source_mask": source_mask}
        if inputs is not None:
            state["inputs"] = inputs
        return state


def map_cache(cache, fn, cross):
    """Apply `fn` to each sub-structure under a `"cross"` key (`cross=True`), or to each
    tensor outside them (`cross=False`); the rest of `cache` is returned as it is."""
    if isinstance(cache, dict):
        return {
            key: (fn(value) if cross else value) if key == "cross" else map_cache(value, fn, cross)
            for key, value in cache.items()
        }
    if isinstance(cache, (list, tuple)):
        return type(cache)(map_cache(value, fn, cross) for value in cache)
    return cache if cross else fn(cache)


class RecomputeStep:
    """No cache: every step re-runs the full decoder (`model.decode`) over the whole prefix.

    This is the baseline that `CachedStep` is measured against; it also recomputes the
    encoder-decoder keys/values from the encoder outputs at every step and layer.

    Args:
        model: exposes `encode` and `decode` like `Transformer`.
        prefix_only: decode only `target_ids[:, :index + 1]` (a shape that changes every
            step). `None` (default) chooses it except under XLA, which needs static shapes
            and then decodes the whole `L`-slot buffer (causal masking makes the logits at
            `index` the same, at about twice the cost).
    """

    can_drop_sentences = True

    def __init__(self, model, prefix_only=None):
        require_tensorflow("Searching without the cache (decoding.RecomputeStep)")
        self.model = model
        self.prefix_only = prefix_only

    def initialize(self, source_ids, buffer_size, num_copies=1):
        encoder_outputs, source_mask = self.model.encode(source_ids)
        state = {
            "encoder_outputs": tile_rows(encoder_outputs, num_copies),  # (N, S, D)
            "source_mask": tile_rows(source_mask, num_copies),  # (N, S)
        }
        inputs = model_source_inputs(self.model, source_ids)
        if inputs:
            state["inputs"] = keras.tree.map_structure(
                lambda tensor: tile_rows(tensor, num_copies), inputs
            )  # (N, ...)
        return state

    def step(self, state, target_ids, index):
        prefix_only = self.prefix_only
        if prefix_only is None:
            prefix_only = not in_xla_context()
        if prefix_only:
            inputs = target_ids[:, : index + 1]  # (N, index + 1)
            position = -1
        else:
            inputs = target_ids[:, :-1]  # (N, L): all decoder input slots
            position = index
        logits = self.model.decode(
            inputs, state["encoder_outputs"], state["source_mask"], **state.get("inputs", {})
        )  # (N, T, V)
        logits = tf.gather(logits, position, axis=1) if not prefix_only else logits[:, -1, :]
        return tf.cast(logits, tf.float32), state

    def reorder(self, state, indices, sentences=None):
        # The search reorders the token prefix itself; the copies of one sentence share
        # the same encoder outputs, so only dropping sentences changes the state.
        return state if sentences is None else _gather_rows(state, indices)


def make_step(model, use_cache=True, prefix_only=None):
    """`CachedStep(model)` or `RecomputeStep(model, prefix_only)`; a step object passes through
    unchanged, and a model that makes its own steps (`decoding.Ensemble`) makes them."""
    if hasattr(model, "initialize") and hasattr(model, "step") and hasattr(model, "reorder"):
        return model
    if hasattr(model, "make_step"):
        return model.make_step(use_cache, prefix_only)
    return CachedStep(model) if use_cache else RecomputeStep(model, prefix_only)
