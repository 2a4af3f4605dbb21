"""The encoder-decoder Transformer as a functional Keras model (paper section 3, Figure 1).

Shape letters: B batch, S source length, T target length, L cache length, D model width,
V vocabulary size.
"""

import warnings

import keras
from keras import ops

from keras_transformer.backends import require_backend
from keras_transformer.layers import packing, quantization
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder import DecoderBlock
from keras_transformer.layers.dropout import ReplicaDropout
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder import EncoderBlock
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.positional import PositionalEncoding, PositionEmbedding, WordIndex
from keras_transformer.layers.tracing import in_xla_context
from keras_transformer.models.config import TransformerConfig, get_preset

# The padding id (`data.tokenizer.PAD_ID`, which owns the special ids): not imported from
# there, so that `import keras_transformer` does not load TensorFlow Text.
PAD_ID = 0


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer: `{"source_ids", "target_ids"}` -> float32 logits `(B, T, V)`.

    A functional model built from the toolkit's layers. `target_ids` is the shifted
    target (BOS first); id 0 is padding. Source and target share one embedding matrix,
    scaled by sqrt(d_model), which is also the pre-softmax projection (untied options in
    the config). Dropout is applied to the sums of embeddings and positional encodings.

    Besides the functional call, it exposes the views used by decoding and export:
    `encode`, `init_cache`, `decode_step` (one or more steps with the key/value cache,
    returning `(logits, cache)`), and `decode` (a full teacher-forced decoder pass).

    `model.quantize("int8")` (Keras' API) makes every weight matrix int8: the attention
    projections, the feed-forward layers, the embedding lookup and the tied (or separate)
    output projection (see `layers.quantization`, docs/serving.md). `get_config` then
    holds each quantized layer's policy in a `keras.dtype_policies.DTypePolicyMap`, so
    `.keras` files and `from_config` rebuild the int8 layers.

    Args:
        config: a `TransformerConfig`, or a preset name.
        dtype: a dtype policy, e.g. "mixed_bfloat16", or the `DTypePolicyMap` of a
            quantized model's config.
        quantization_config: the `keras.quantizers.Int8QuantizationConfig` the model was
            quantized with, for a quantized model's config (None: Keras' defaults).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import Transformer, get_preset
    >>> model = Transformer(get_preset("tiny", vocabulary_size=100, num_encoder_layers=1,
    ...                                num_decoder_layers=1))
    >>> logits = model({"source_ids": np.array([[5, 6, 3]]), "target_ids": np.array([[2, 7]])})
    >>> tuple(logits.shape)
    (1, 2, 100)
    """

    # `decode_step` accepts encoder-decoder caches and source masks with one row per
    # sentence for `B * C` token rows (C copies per sentence, as in beam search); see
    # `decoding.CachedStep`.
    supports_shared_cross_cache = True
    # `init_cache(encoder_outputs, None)` gives growing self-attention caches (ring buffers
    # with a window); see `decoding.CachedStep`.
    supports_growing_cache = True

    def __init__(self, config, dtype=None, quantization_config=None, **kwargs):
        if isinstance(config, str):
            config = get_preset(config)
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config
        policy = (
            keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
        )
        # --- layers ---
        source_embedding = SharedEmbedding(
            config.vocabulary_size, config.hidden_dim, dtype=policy, name="token_embedding"
        )
        if config.share_embeddings:
            target_embedding = source_embedding
        else:
            target_embedding = SharedEmbedding(
                config.vocabulary_size,
                config.hidden_dim,
                dtype=policy,
                name="target_token_embedding",
            )
        if config.positional == "learned":
            source_position = PositionEmbedding(
                config.max_length, dtype=policy, name="source_position_embedding"
            )
            target_position = PositionEmbedding(
                config.max_length, dtype=policy, name="target_position_embedding"
            )
        else:
            source_position = target_position = PositionalEncoding(
                dtype=policy, name="positional_encoding"
            )
        # With `word_positions`, the table of which pieces start words and which are tags
        # (set from the tokenizer: `set_word_kinds`).
        word_index = (
            WordIndex(config.vocabulary_size, name="word_index") if config.word_positions else None
        )
        block_kwargs = dict(
            num_heads=config.num_heads,
            intermediate_dim=config.intermediate_dim,
            key_dim=config.key_dim,
            value_dim=config.value_dim,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            attention_window=config.attention_window,
            activation_dropout=config.activation_dropout,
            activation=config.activation,
            layer_norm_epsilon=config.layer_norm_epsilon,
            normalize_first=config.normalize_first,
            dtype=policy,
        )
        encoder_layers = [
            EncoderBlock(name=f"encoder_layer_{i}", **block_kwargs)
            for i in range(config.num_encoder_layers)
        ]
        decoder_layers = [
            DecoderBlock(name=f"decoder_layer_{i}", **block_kwargs)
            for i in range(config.num_decoder_layers)
        ]
        final_norms = {}
        if config.normalize_first:
            for side in ("encoder", "decoder"):
                final_norms[side] = LayerNormalization(
                    epsilon=config.layer_norm_epsilon, dtype=policy, name=f"{side}_final_layer_norm"
                )
        output_projection = None
        if not config.tie_output:
            output_projection = keras.layers.Dense(
                config.vocabulary_size, dtype=policy, name="output_projection"
            )
        source_dropout = ReplicaDropout(
            config.dropout, dtype=policy, name="source_embedding_dropout"
        )
        target_dropout = ReplicaDropout(
            config.dropout, dtype=policy, name="target_embedding_dropout"
        )

        self.source_embedding = source_embedding
        self.target_embedding = target_embedding
        self.source_position = source_position
        self.target_position = target_position
        self.source_dropout = source_dropout
        self.target_dropout = target_dropout
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.final_norms = final_norms
        self.output_projection = output_projection
        self.quantization_config = quantization_config
        if (
            quantization_config is not None
        ):  # before the graph below builds the int8 layers of a quantized config
            for layer in self._flatten_layers(
                include_self=False
            ):  # ours, and Dense; a feed-forward
                if hasattr(
                    layer, "quantization_config"
                ):  # layer passes its own to the Dense it builds
                    layer.quantization_config = quantization_config
        self.word_index = word_index
        # A word window masks encoder-decoder attention per hypothesis (each has its own
        # current word), so beam copies cannot share one row of cross keys/values and mask.
        self.supports_shared_cross_cache = config.word_window is None

        # --- functional graph ---
        source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
        target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
        # On TensorFlow the position-wise work skips the padding (`layers.packing`).
        packed = self._packs
        encoder_outputs, source_mask = self._encode(source_ids, training=None, packed=packed)
        source_words = (
            self.source_word_positions(source_ids) if config.word_window is not None else None
        )
        logits = self._decode(
            target_ids,
            encoder_outputs,
            source_mask,
            training=None,
            source_words=source_words,
            packed=packed,
        )
        super().__init__(
            inputs={"source_ids": source_ids, "target_ids": target_ids}, outputs=logits, **kwargs
        )
        # keras.Model's functional constructor ignores `dtype`; set the policy the sub-layers
        # use on the model itself, so that `get_config` (and `.keras` files) keep it.
        self.dtype_policy = policy

    def __setattr__(self, name, value):
        # PyTorch's `Module` takes no sub-module as an attribute before `Module.__init__`,
        # which runs inside the functional constructor, after the layers are assigned.
        # Until then a layer is tracked as Keras tracks it on the other backends (so the
        # weights come in the same order everywhere) and set as a plain attribute.
        if (
            keras.backend.backend() == "torch"
            and "_modules" not in self.__dict__
            and isinstance(value, keras.Layer)
        ):
            self._initialize_tracker()
            object.__setattr__(self, name, self._tracker.track(value))
            return
        super().__setattr__(name, value)

    @property
    def _packs(self):
        """Whether the forward pass computes the position-wise work on the real tokens only
        (`config.skip_padding`, on TensorFlow: `layers.packing`)."""
        return self.config.skip_padding and keras.backend.backend() == "tensorflow"

    # --- fit and evaluate ---

    def real_target_logits(self, inputs, labels, training=None):
        """The training output over the target's real positions only: `(labels (N,), logits (N, V))`.

        The forward pass of `model(inputs)` up to the decoder's rows (`layers.packing`), which
        are not laid back out as `(B, T, D)`: the output projection, the float32 logits and
        the loss skip the target's padding (about a fifth of the positions of a bucketed
        batch). At every real position the logits, and so the loss and its gradients, are
        those of `model(inputs)` (tested to 1e-5), with the same dropout masks. The training
        loop, `fit`, validation and the benchmark's step compute the loss on this output.

        Without a packing (`config.skip_padding` off, or off TensorFlow) it is `labels` and
        `model(inputs)`'s `(B, T, V)` logits; under XLA the packing carries every position
        (`packing.packed_positions`): `(B * T,)` and `(B * T, V)`, padding included.

        Args:
            inputs: `{"source_ids", "target_ids"}`, as for the model's call.
            labels: int `(B, T)`, 0 where `target_ids` is 0 (the data pipeline's labels are the
                target shifted by one): a real token at a padded position of `target_ids`
                would not reach the loss, and raises `InvalidArgumentError` naming it.
            training: as for the model's call (dropout).

        Returns:
            `(labels, logits)`: int32 `(N,)` and float32 `(N, V)` on the N real target positions.
        """
        if not self._packs:
            return labels, self(inputs, training=training)
        source_ids = ops.convert_to_tensor(inputs["source_ids"], "int32")
        target_ids = ops.convert_to_tensor(inputs["target_ids"], "int32")
        encoder_outputs, source_packing = self._encode(source_ids, training=training, packed=True)
        source_words = self.source_word_positions(source_ids) if self.uses_word_window else None
        logits, positions = self._decode(
            target_ids,
            encoder_outputs,
            source_packing,
            training=training,
            source_words=source_words,
            packed=True,
            rows=True,
        )
        labels = ops.reshape(ops.convert_to_tensor(labels, "int32"), (-1,))
        real_labels = ops.take(labels, positions, axis=0)
        if not in_xla_context():
            import tensorflow as tf

            tf.debugging.assert_equal(
                ops.sum(ops.cast(ops.not_equal(real_labels, PAD_ID), "int32")),
                ops.sum(ops.cast(ops.not_equal(labels, PAD_ID), "int32")),
                message="labels hold real tokens where target_ids is padding (0): the loss over the real target "
                "positions would leave them out; pad labels where target_ids is padded",
            )
        return real_labels, logits

    def train_step(self, *args):
        """Keras' step, with one finite-or-skip decision for all replicas and a token-weighted loss
        (TensorFlow; see `training.fit`). Other backends take Keras' own step, with its own
        arguments (JAX's is `(state, data)`, PyTorch's `(data)`).

        Under a `keras.distribution` (JAX only: Keras' TensorFlow one is a prototype, and
        PyTorch has none and would train on one device) it raises a one-line `RuntimeError`
        elsewhere."""
        _check_distribution()
        if keras.backend.backend() != "tensorflow":
            return super().train_step(*args)
        from keras_transformer.training import fit  # training imports models: not at module level

        return fit.train_step(self, *args)

    def test_step(self, *args):
        _check_distribution()
        if keras.backend.backend() != "tensorflow":
            return super().test_step(*args)
        from keras_transformer.training import fit

        return fit.test_step(self, *args)

    # --- the views used by decoding and export ---

    def _packing_layer(self, layer_class):
        """A `layers.packing` layer (`RealPositions`, `Pack`, `Unpack`) in the model's dtype policy."""
        return layer_class(dtype=self.source_dropout.dtype_policy)

    def _embed(
        self,
        token_ids,
        embedding,
        position,
        dropout,
        start_index=0,
        training=None,
        word_positions=None,
        real_positions=None,
    ):
        """`(B, T, D)` embeddings plus positions, after dropout; with `real_positions` (`layers.packing`),
        the `(N, D)` rows of those positions only."""
        hidden = embedding(token_ids)  # (B, T, D), scaled by sqrt(D)
        if word_positions is None:
            hidden = hidden + position(hidden, start_index=start_index)
        else:
            hidden = hidden + position(
                hidden, start_index=start_index, word_positions=word_positions
            )
        if real_positions is not None:
            hidden = self._packing_layer(packing.Pack)(hidden, real_positions)  # (N, D)
        return dropout(hidden, training=training)

    @property
    def uses_word_positions(self):
        """Whether positions count words (`config.word_positions`): `decode_step` then needs
        `word_positions` (see `target_word_positions`)."""
        return self.word_index is not None

    def set_word_kinds(self, kinds):
        """Set the `word_positions` table: `(V,)` kinds, `layers.WordIndex.OTHER`, `WORD_START`
        or `TAG` per id (`decoding.tree_constraint.word_kinds(tokenizer)`)."""
        if self.word_index is None:
            raise ValueError("set_word_kinds needs a model with word_positions=True")
        self.word_index.set_kinds(kinds)

    def target_word_positions(self, target_ids):
        """int `(B, T)`: the word index of each decoder input (`layers.positional.WordIndex.target`)."""
        return self.word_index.target(ops.convert_to_tensor(target_ids, "int32"))

    @property
    def uses_word_window(self):
        """Whether encoder-decoder attention is limited to the current word's neighbours
        (`config.word_window`): `decode` and `decode_step` then need `source_word_positions`."""
        return self.config.word_window is not None

    def source_word_positions(self, source_ids):
        """int `(B, S)`: the word index of each source piece (`layers.positional.WordIndex.source`)."""
        return self.word_index.source(ops.convert_to_tensor(source_ids, "int32"))

    def _window_mask(self, source_words, target_words):
        """bool `(B, T, S)`: the source pieces within `word_window` words of each query's word."""
        distance = ops.abs(ops.expand_dims(source_words, 1) - ops.expand_dims(target_words, 2))
        return ops.less_equal(distance, self.config.word_window)

    def _check_source_words(self, source_words, method):
        if (source_words is None) == self.uses_word_window:
            raise ValueError(
                f"{method} takes source_word_positions exactly when the model has a word_window. "
                f"Received: source_word_positions={'None' if source_words is None else 'a tensor'}, "
                f"config.word_window={self.config.word_window}"
            )

    def _encode(self, source_ids, training=None, packed=False):
        """`(hidden (B, S, D), source_mask (B, S))`; `packed`: `(hidden (N_S, D), source_packing)`,
        the rows of the real positions and their packing (`layers.packing`)."""
        source_mask = padding_mask(source_ids, PAD_ID)  # (B, S)
        source_packing = (
            (self._packing_layer(packing.RealPositions)(source_mask), source_mask)
            if packed
            else None
        )
        words = self.word_index.source(source_ids) if self.word_index is not None else None
        hidden = self._embed(
            source_ids,
            self.source_embedding,
            self.source_position,
            self.source_dropout,
            training=training,
            word_positions=words,
            real_positions=source_packing[0] if packed else None,
        )
        for layer in self.encoder_layers:
            if packed:
                hidden = layer(hidden, packing=source_packing, training=training)
            else:
                hidden = layer(hidden, padding_mask=source_mask, training=training)  # (B, S, D)
        if "encoder" in self.final_norms:
            hidden = self.final_norms["encoder"](hidden)
        return hidden, source_packing if packed else source_mask

    def _logits(self, hidden, output_ids=None):
        if "decoder" in self.final_norms:
            hidden = self.final_norms["decoder"](hidden)
        if self.output_projection is None:
            return self.target_embedding(
                hidden, reverse=True, output_ids=output_ids
            )  # (B, T, V|V') float32
        if output_ids is not None:
            raise ValueError(
                "A vocabulary shortlist (output_ids) needs the output projection tied to the target "
                "embedding. Received: config.tie_output=False"
            )
        return ops.cast(self.output_projection(hidden), "float32")

    def _decode(
        self,
        target_ids,
        encoder_outputs,
        source_mask,
        training=None,
        return_attention_scores=False,
        source_words=None,
        packed=False,
        rows=False,
    ):
        """Logits `(B, T, V)` (and the attention scores). `packed`: `encoder_outputs` and
        `source_mask` are the rows and the packing of `_encode(..., packed=True)`, and the
        decoder's position-wise work runs on the target's real positions only; with `rows`,
        `(logits (N, V), positions (N,))` on those positions (`real_target_logits`)."""
        target_mask = padding_mask(target_ids, PAD_ID)  # (B, T)
        target_packing = (
            (self._packing_layer(packing.RealPositions)(target_mask), target_mask)
            if packed
            else None
        )
        words = self.word_index.target(target_ids) if self.word_index is not None else None
        hidden = self._embed(
            target_ids,
            self.target_embedding,
            self.target_position,
            self.target_dropout,
            training=training,
            word_positions=words,
            real_positions=target_packing[0] if packed else None,
        )
        window = (
            self._window_mask(source_words, words) if source_words is not None else None
        )  # (B, T, S)
        if packed:
            masks = dict(decoder_packing=target_packing, encoder_packing=source_mask)
        else:
            masks = dict(decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
        scores = []
        for layer in self.decoder_layers:
            result = layer(
                hidden,
                encoder_outputs,
                encoder_attention_mask=window,
                return_attention_scores=return_attention_scores,
                training=training,
                **masks,
            )
            if return_attention_scores:
                hidden, layer_scores = result
                scores.append(layer_scores)
            else:
                hidden = result
        if rows:
            return self._logits(hidden), target_packing[0]
        if packed:
            hidden = self._packing_layer(packing.Unpack)(
                hidden, *target_packing
            )  # (B, T, D), zeros at the padding
        logits = self._logits(hidden)
        if return_attention_scores:
            return logits, scores
        return logits

    def encode(self, source_ids, training=False):
        """Run the encoder.

        Args:
            source_ids: int `(B, S)`, 0 = padding.

        Returns:
            `(encoder_outputs (B, S, D), source_padding_mask (B, S) bool)`.
        """
        return self._encode(ops.convert_to_tensor(source_ids, "int32"), training=training)

    def encoder_attention_scores(self, source_ids):
        """Self-attention weights of every encoder layer: a list of `(B, H, S, S)`."""
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        source_mask = padding_mask(source_ids, PAD_ID)
        words = self.word_index.source(source_ids) if self.word_index is not None else None
        hidden = self._embed(
            source_ids,
            self.source_embedding,
            self.source_position,
            self.source_dropout,
            training=False,
            word_positions=words,
        )
        scores = []
        for layer in self.encoder_layers:
            hidden, layer_scores = layer(
                hidden, padding_mask=source_mask, return_attention_scores=True, training=False
            )
            scores.append(layer_scores)
        return scores

    def decode(
        self,
        target_ids,
        encoder_outputs,
        source_padding_mask,
        training=False,
        return_attention_scores=False,
        source_word_positions=None,
    ):
        """A full (teacher-forced, uncached) decoder pass.

        Args:
            target_ids: int `(B, T)`, shifted target (BOS first), 0 = padding.
            encoder_outputs: `(B, S, D)` from `encode`.
            source_padding_mask: bool `(B, S)` from `encode`.
            return_attention_scores: also return, per decoder layer,
                `{"self": (B, H, T, T), "cross": (B, H, T, S)}`.
            source_word_positions: with `config.word_window` (and only then), int `(B, S)`
                from `source_word_positions(source_ids)`.

        Returns:
            float32 logits `(B, T, V)`, or `(logits, scores)`.
        """
        self._check_source_words(source_word_positions, "decode")
        return self._decode(
            ops.convert_to_tensor(target_ids, "int32"),
            encoder_outputs,
            source_padding_mask,
            training=training,
            return_attention_scores=return_attention_scores,
            source_words=source_word_positions,
        )

    def init_cache(self, encoder_outputs, max_length):
        """Per-decoder-layer caches: empty self-attention buffers of `max_length` slots (a
        ring of `min(attention_window, max_length)` slots with a window; with
        `max_length=None`, caches that grow by the positions each `decode_step` adds) and
        the encoder-decoder keys/values computed once from `encoder_outputs`.

        Returns:
            a tuple with one `{"self": {"key", "value"} (growing: {"past_key", "past_value"}),
            "cross": {"key", "value"}}` per layer.
        """
        return tuple(layer.init_cache(encoder_outputs, max_length) for layer in self.decoder_layers)

    def decode_step(
        self,
        token_ids,
        cache,
        cache_index,
        source_padding_mask,
        word_positions=None,
        source_word_positions=None,
        output_ids=None,
    ):
        """Decode new target positions with the cache (inference: dropout off).

        Args:
            token_ids: int `(B, Q)`: the tokens at target positions
                `cache_index .. cache_index + Q - 1` (usually Q = 1).
            cache: from `init_cache` or a previous `decode_step`. The self-attention
                buffers have `B` rows; the encoder-decoder keys/values (`"cross"`) may
                instead have `B / C` rows, one per sentence, when row `b * C + c` of
                `token_ids` is copy `c` of sentence `b` (beam search): the copies then
                share them without tiling.
            cache_index: int scalar, the target position of `token_ids[:, 0]`.
            source_padding_mask: bool `(B, S)` from `encode`, or `(B / C, S)` with a
                shared encoder-decoder cache.
            word_positions: with `config.word_positions` (and only then), int `(B, Q)`: the
                word index of each token, `target_word_positions` of the whole prefix at
                these positions (the tags before a token are not in the cache's tokens).
            source_word_positions: with `config.word_window` (and only then), int `(B, S)`
                from `source_word_positions(source_ids)`, one row per token row (a model
                with a word window shares no cross cache between beam copies).
            output_ids: None, or int `(V',)`: logits for these tokens only (a vocabulary
                shortlist, `decoding.shortlist`; needs the tied output projection).

        Returns:
            `(logits (B, Q, V) float32, cache)`; `(B, Q, V')` with `output_ids`.
        """
        if (word_positions is None) == self.uses_word_positions:
            raise ValueError(
                "decode_step takes word_positions exactly when the model has word_positions=True. "
                f"Received: word_positions={'None' if word_positions is None else 'a tensor'}, "
                f"config.word_positions={self.config.word_positions}"
            )
        self._check_source_words(source_word_positions, "decode_step")
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        hidden = self._embed(
            token_ids,
            self.target_embedding,
            self.target_position,
            self.target_dropout,
            start_index=cache_index,
            training=False,
            word_positions=word_positions,
        )
        window = None
        if source_word_positions is not None:
            window = self._window_mask(
                source_word_positions, ops.convert_to_tensor(word_positions, "int32")
            )  # (B, Q, S)
        new_cache = []
        for layer, layer_cache in zip(self.decoder_layers, cache):
            hidden, layer_cache = layer(
                hidden,
                encoder_padding_mask=source_padding_mask,
                encoder_attention_mask=window,
                cache=layer_cache,
                cache_index=cache_index,
                training=False,
            )
            new_cache.append(layer_cache)
        return self._logits(hidden, output_ids), tuple(new_cache)

    # --- int8 ---

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """`keras.Model.quantize`, which also reaches the attention layers (Keras quantizes
        only layers without sub-layers, and ours hold their dropout as one).

        Args:
            mode: "int8" (the mode every layer of the model implements).
            config: a `keras.quantizers.Int8QuantizationConfig` (e.g. weight-only int8 with
                `activation_quantizer=None`), or None for Keras' defaults.
            filters: as for `keras.Model.quantize`: which layers to quantize.

        Raises:
            NotImplementedError: for another mode Keras knows ("int4", "float8", ...), one
                line naming it, before any layer changes (`keras.Model.quantize` would
                quantize the layers that support it and only warn about the others).
            ValueError: Keras' error for a mode it does not know (Keras checks the
                arguments of every layer's `quantize` before the method runs).
        """
        if mode not in quantization.MODES:
            raise quantization.mode_error(mode)
        with (
            quantization.one_garbage_collection()
        ):  # Keras collects once per float kernel it removes
            attention = [
                layer for layer in self._flatten_layers() if isinstance(layer, MultiHeadAttention)
            ]
            if filters is not None:
                from keras.src.quantizers.utils import (
                    should_quantize_layer,
                )  # the filters' meaning in Model.quantize

                attention = [layer for layer in attention if should_quantize_layer(layer, filters)]
            for layer in attention:
                layer.quantize(mode, config=config)
            with warnings.catch_warnings():
                # Keras warns about each layer without a `quantize` method; these hold no weight
                # matrix. (A learned position table is left float, and Keras says so.)
                for name in (
                    "PositionalEncoding",
                    "ReplicaDropout",
                    "LayerNormalization",
                    "InputLayer",
                    "RealPositions",
                    "Pack",
                    "Unpack",
                ):
                    warnings.filterwarnings(
                        "ignore", message=f"Layer {name} does not have a `quantize` method"
                    )
                super().quantize(mode, config=config, filters=filters, **kwargs)
        self.quantization_config = config

    def get_config(self):
        return {
            "config": self.config.to_dict(),
            "dtype": keras.dtype_policies.serialize(self._config_dtype_policy()),
            "name": self.name,
            "trainable": self.trainable,
            "quantization_config": keras.saving.serialize_keras_object(self.quantization_config),
        }

    def _config_dtype_policy(self):
        """The model's policy; once layers are quantized, a `DTypePolicyMap` of their policies
        (layer path -> e.g. "int8_from_float32") over the model's (as keras-hub's `Backbone`)."""
        policy = self.dtype_policy
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):  # rebuilt from such a config
            return policy
        policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
        for layer in self._flatten_layers(include_self=False):
            if layer.quantization_mode is not None:
                policy_map[layer.path] = layer.dtype_policy
        return policy_map if len(policy_map) else policy

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        config["quantization_config"] = keras.saving.deserialize_keras_object(
            config.get("quantization_config")
        )
        return cls(**config)


def _check_distribution():
    """A one-line error, off JAX, when a `keras.distribution` is set (see `Transformer.train_step`)."""
    if keras.distribution.distribution() is not None:
        on_tensorflow = keras.backend.backend() == "tensorflow"
        require_backend(
            "Training under keras.distribution (Transformer.fit, evaluate)",
            "jax",
            hint="use a tf.distribute strategy, docs/distributed.md" if on_tensorflow else None,
        )
