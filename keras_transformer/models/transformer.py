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
from keras_transformer.layers.embedding import LogitsBias, SharedEmbedding
from keras_transformer.layers.encoder import EncoderBlock
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.positional import PositionalEncoding, PositionEmbedding
from keras_transformer.layers.tracing import in_xla_context
from keras_transformer.models.config import TransformerConfig, get_preset, model_config

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

    A model that extends it (`models.parsing.ParsingTransformer`) passes what else it needs
    through hooks that the Transformer leaves empty: extra inputs of `decode` and
    `decode_step` read off the source (`source_inputs`) and off the target prefix
    (`prefix_inputs`), which the searches and the export pass on; what it reads from the
    run's tokenizer before training (`reads_tokenizer`, `read_tokenizer`); and, inside the
    graph, the position encodings and an encoder-decoder attention mask. Build a run's
    model with `build_model(config)`, which picks the class of the config.

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
    # The config class this model is built from (`build_model` maps configs to models by it).
    config_class = TransformerConfig
    # Whether the trainer calls `read_tokenizer` with the run's tokenizer before training.
    reads_tokenizer = False
    # The names `source_inputs` and `prefix_inputs` may give (`decode`, `decode_step` take them).
    extra_inputs = ()

    def __init__(self, config, dtype=None, quantization_config=None, **kwargs):
        if isinstance(config, str):
            config = get_preset(config)
        if isinstance(config, dict):
            config = self.config_class.from_dict(config)
        if type(config) is not self.config_class:
            raise ValueError(
                f"{type(self).__name__} is built from a {self.config_class.__name__}; a "
                f"{type(config).__name__} builds a {model_class(config).__name__} "
                "(models.build_model(config))"
            )
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
                config.decoder_vocabulary_size,
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
                layout=config.sinusoid_layout, dtype=policy, name="positional_encoding"
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
                config.decoder_vocabulary_size, dtype=policy, name="output_projection"
            )
        # Created only when set: the runs written without it keep their variables' names.
        logits_bias = (
            LogitsBias(config.decoder_vocabulary_size, dtype=policy, name="final_logits_bias")
            if config.final_logits_bias
            else None
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
        self.logits_bias = logits_bias
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
        self._build_extra_layers(config)

        # --- functional graph ---
        source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
        target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
        # On TensorFlow the position-wise work skips the padding (`layers.packing`).
        packed = self._packs
        encoder_outputs, source_mask = self._encode(source_ids, training=None, packed=packed)
        logits = self._decode(
            target_ids,
            encoder_outputs,
            source_mask,
            training=None,
            inputs=self.source_inputs(source_ids),
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
        logits, positions = self._decode(
            target_ids,
            encoder_outputs,
            source_packing,
            training=training,
            inputs=self.source_inputs(source_ids),
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

    def _embed(self, token_ids, embedding, positions, dropout, training=None, real_positions=None):
        """`(B, T, D)` embeddings plus `positions(embeddings)` (the position encodings), after
        dropout; with `real_positions` (`layers.packing`), the `(N, D)` rows of those positions only."""
        hidden = embedding(token_ids)  # (B, T, D), scaled by sqrt(D)
        hidden = hidden + positions(hidden)
        if real_positions is not None:
            hidden = self._packing_layer(packing.Pack)(hidden, real_positions)  # (N, D)
        return dropout(hidden, training=training)

    # --- hooks: what a model that extends the Transformer overrides ---
    # A checkpoint names the layers by the index of their operation in the functional graph:
    # an override that adds or moves an operation there renames the variables of the runs
    # already written (tests/test_parsing_model.py loads runs written before the split).

    def _build_extra_layers(self, config):
        """Create the layers a subclass adds, before the graph is built (the Transformer: none)."""

    def read_tokenizer(self, tokenizer):
        """Read what the model takes from its run's tokenizer (`reads_tokenizer`; the Transformer: nothing)."""

    def source_inputs(self, source_ids):
        """The extra inputs of `decode` and `decode_step` read off the source: a dict of tensors
        with one row per sentence, which a search tiles to the copies of each sentence and
        passes (by keyword) to every step. The Transformer takes none: `{}`."""
        return {}

    def prefix_inputs(self, target_ids, index):
        """The extra inputs of `decode_step` read off the decoder inputs `target_ids (N, L + 1)`
        at step `index` (the tokens so far). The Transformer takes none: `{}`."""
        return {}

    def _target_inputs(self, target_ids, inputs):
        """`inputs` completed with what the decoder reads off the whole `target_ids`: a full
        (teacher-forced) pass computes here what `prefix_inputs` gives a step."""
        return inputs

    def _source_positions(self, source_ids):
        """A function of the source's embeddings `(B, S, D)`: their position encodings."""
        return self.source_position

    def _target_positions(self, start_index, inputs):
        """A function of the decoder inputs' embeddings `(B, T, D)`, the first at `start_index`:
        their position encodings."""
        return lambda embedded: self.target_position(embedded, start_index=start_index)

    def _encoder_attention_mask(self, inputs):
        """None, or bool `(B, T, S)`: which source positions each decoder query may attend to
        (besides the source padding). The Transformer: None, every position."""
        return None

    def _encode(self, source_ids, training=None, packed=False):
        """`(hidden (B, S, D), source_mask (B, S))`; `packed`: `(hidden (N_S, D), source_packing)`,
        the rows of the real positions and their packing (`layers.packing`)."""
        source_mask = padding_mask(source_ids, PAD_ID)  # (B, S)
        source_packing = (
            (self._packing_layer(packing.RealPositions)(source_mask), source_mask)
            if packed
            else None
        )
        hidden = self._embed(
            source_ids,
            self.source_embedding,
            self._source_positions(source_ids),
            self.source_dropout,
            training=training,
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
        """The float32 logits `(..., V)` (`(..., V')` of `output_ids`) of the decoder's hidden
        states: every path computes them here (training, `decode`, `decode_step`, the searches,
        a shortlist, int8), with the final norm, the output projection and the final bias."""
        if "decoder" in self.final_norms:
            hidden = self.final_norms["decoder"](hidden)
        if self.output_projection is None:
            logits = self.target_embedding(
                hidden, reverse=True, output_ids=output_ids
            )  # (B, T, V|V') float32
        elif output_ids is not None:
            raise ValueError(
                "A vocabulary shortlist (output_ids) needs the output projection tied to the target "
                "embedding. Received: config.tie_output=False"
            )
        else:
            logits = ops.cast(self.output_projection(hidden), "float32")
        if self.logits_bias is not None:
            logits = self.logits_bias(logits, output_ids=output_ids)
        return logits

    def _decode(
        self,
        target_ids,
        encoder_outputs,
        source_mask,
        training=None,
        return_attention_scores=False,
        inputs=None,
        packed=False,
        rows=False,
    ):
        """Logits `(B, T, V)` (and the attention scores). `inputs`: the model's `source_inputs`.
        `packed`: `encoder_outputs` and
        `source_mask` are the rows and the packing of `_encode(..., packed=True)`, and the
        decoder's position-wise work runs on the target's real positions only; with `rows`,
        `(logits (N, V), positions (N,))` on those positions (`real_target_logits`)."""
        target_mask = padding_mask(target_ids, PAD_ID)  # (B, T)
        target_packing = (
            (self._packing_layer(packing.RealPositions)(target_mask), target_mask)
            if packed
            else None
        )
        inputs = self._target_inputs(target_ids, inputs or {})
        hidden = self._embed(
            target_ids,
            self.target_embedding,
            self._target_positions(0, inputs),
            self.target_dropout,
            training=training,
            real_positions=target_packing[0] if packed else None,
        )
        window = self._encoder_attention_mask(inputs)  # None or (B, T, S)
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
        hidden = self._embed(
            source_ids,
            self.source_embedding,
            self._source_positions(source_ids),
            self.source_dropout,
            training=False,
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
        **inputs,
    ):
        """A full (teacher-forced, uncached) decoder pass.

        Args:
            target_ids: int `(B, T)`, shifted target (BOS first), 0 = padding.
            encoder_outputs: `(B, S, D)` from `encode`.
            source_padding_mask: bool `(B, S)` from `encode`.
            return_attention_scores: also return, per decoder layer,
                `{"self": (B, H, T, T), "cross": (B, H, T, S)}`.
            **inputs: the model's `source_inputs(source_ids)` (none for the Transformer).

        Returns:
            float32 logits `(B, T, V)`, or `(logits, scores)`.
        """
        self._check_inputs(inputs, "decode")
        return self._decode(
            ops.convert_to_tensor(target_ids, "int32"),
            encoder_outputs,
            source_padding_mask,
            training=training,
            return_attention_scores=return_attention_scores,
            inputs=inputs,
        )

    def _check_inputs(self, inputs, method):
        """A one-line TypeError for an extra input the model does not take (`extra_inputs`)."""
        unknown = sorted(set(inputs) - set(self.extra_inputs))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.{method} takes no input {unknown}; its extra inputs: "
                f"{list(self.extra_inputs)}"
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
        output_ids=None,
        **inputs,
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
            output_ids: None, or int `(V',)`: logits for these tokens only (a vocabulary
                shortlist, `decoding.shortlist`; needs the tied output projection).
            **inputs: the model's `source_inputs(source_ids)`, one row per token row, and its
                `prefix_inputs` at these positions (none for the Transformer).

        Returns:
            `(logits (B, Q, V) float32, cache)`; `(B, Q, V')` with `output_ids`.
        """
        self._check_inputs(inputs, "decode_step")
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        hidden = self._embed(
            token_ids,
            self.target_embedding,
            self._target_positions(cache_index, inputs),
            self.target_dropout,
            training=False,
        )
        window = self._encoder_attention_mask(inputs)  # None or (B, Q, S)
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
                    "LogitsBias",
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
        # A file saved as a "Transformer" with a parsing model's fields (before the parsing
        # model was its own class) builds the model its fields describe.
        settings = config.pop("config")
        settings = model_config(settings) if isinstance(settings, dict) else settings
        return model_class(settings)(settings, **config)


_MODEL_CLASSES = {}


def register_model(cls):
    """Class decorator: `build_model` builds `cls` from a `cls.config_class` config."""
    _MODEL_CLASSES[cls.config_class] = cls
    return cls


def model_class(config):
    """The model class of `config` (a `TransformerConfig` or a subclass's, `register_model`)."""
    return _MODEL_CLASSES[type(config)]


def build_model(config, **kwargs):
    """The model of `config` (`models.config.model_config`): a `Transformer` for a
    `TransformerConfig`, a `models.parsing.ParsingTransformer` for a `ParsingConfig`.

    Args:
        config: a config, its dict (a run's `config.json` "model") or a preset name.
        **kwargs: the model's other arguments (`dtype`, `quantization_config`, `name`).

    Example:

    >>> type(build_model(get_preset("ptb_sample", vocabulary_size=32, num_encoder_layers=1,
    ...                             num_decoder_layers=1))).__name__
    'ParsingTransformer'
    """
    if isinstance(config, str):
        config = get_preset(config)
    if isinstance(config, dict):
        config = model_config(config)
    return model_class(config)(config, **kwargs)


register_model(Transformer)


def _check_distribution():
    """A one-line error, off JAX, when a `keras.distribution` is set (see `Transformer.train_step`)."""
    if keras.distribution.distribution() is not None:
        on_tensorflow = keras.backend.backend() == "tensorflow"
        require_backend(
            "Training under keras.distribution (Transformer.fit, evaluate)",
            "jax",
            hint="use a tf.distribute strategy, docs/distributed.md" if on_tensorflow else None,
        )
