"""Multi-head attention (paper section 3.2.2): the layer.

The function it computes per head is in `scaled_dot_product`, its restricted (windowed)
variant in `windowed_attention`, and its key/value cache for decoding in `attention_cache`.

Shape letters: B batch, Q query length, K key length, L cache length, D model width,
H heads, Dk key/query width per head, Dv value width per head.
"""

import keras
from keras import ops

from keras_transformer.layers import attention_cache, quantization
from keras_transformer.layers import masks as masks_lib
from keras_transformer.layers import packing as packing_lib
from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.dropout import ReplicaDropout
from keras_transformer.layers.scaled_dot_product import attention_weights
from keras_transformer.layers.windowed_attention import band_mask, windowed_attention


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention: Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The model width D is inferred from the query in `build`; by default
    `key_dim = value_dim = D / num_heads` as in the paper. The weights have the same
    shapes as `keras.layers.MultiHeadAttention` (`(D, H, Dk)` projections, `(H, Dv, D)`
    output), so weights can be copied between the two.

    Besides plain attention it has modes for the padding-free layout of `layers.packing`,
    restricted self-attention (`attention_window`), incremental decoding with a key/value
    cache (a preallocated, growing or ring buffer for self-attention; keys/values computed
    once by `compute_cache` for encoder-decoder attention) and int8 projections
    (`layer.quantize("int8")`). Each mode, what it computes and why it exists:
    docs/architecture.md, "Attention modes". In cached mode the call always returns
    `(outputs, cache)`.

    Args:
        num_heads: number of heads H.
        key_dim: per-head query/key width Dk. Defaults to D / H.
        value_dim: per-head value width Dv. Defaults to `key_dim`.
        output_dim: width of the output. Defaults to the query width D.
        dropout: dropout rate on the attention weights (the paper uses 0).
        attention_window: restricted self-attention (paper Table 1): each query sees only
            the keys at distance < `attention_window` (with `use_causal_mask`: itself and
            the `attention_window - 1` positions before it); for self-attention only (the
            keys are the query positions). Without a cache, scores or an explicit
            `attention_mask` the layer computes only those scores, in blocks
            (`windowed_attention`: O(N * window) work and memory); otherwise the same band
            is applied as a mask. `None` (default): full attention.
        use_bias: whether the projections have biases.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the biases.
        quantization_config: the `keras.quantizers.QuantizationConfig` of an int8 layer
            (set by `quantize`; None: Keras' defaults).

    Call arguments:
        query: `(B, Q, D)`.
        value: `(B, K, D)`; may be `None` with a static (cross-attention) cache.
        key: `(B, K, D)`; defaults to `value`.
        attention_mask: optional bool `(B, Q, K)`; True = may attend.
        query_mask, value_mask, key_mask: optional padding masks `(B, Q)`, `(B, K)`, usually
            filled in by Keras from implicit masks. Padded keys are not attended.
        use_causal_mask: add the look-ahead mask (decoder self-attention).
        return_attention_scores: also return the attention weights `(B, H, Q, K)`
            (not in cached mode).
        cache: optional key/value cache dict (`init_cache`, `compute_cache`).
        cache_index: int scalar; write position in the self-attention cache; without it
            the cache is encoder-decoder keys/values, and `value`/`key` are ignored.
        training: whether dropout is active.
        query_packing: optional packing `(positions, mask)` of the queries' `(B, Q)` batch
            (`layers.packing`): `query` is then `(N, D)`, the rows of its N real
            positions, and so are the outputs, `(N, output_dim)`. Only those rows are
            projected; attention itself runs on the `(B, Q)` layout.
        key_packing: the same for `value` and `key` (`(N_K, D)` rows of a `(B, K)`
            batch); its mask is the `key_mask`. Neither packing works with a cache.

    Returns:
        `outputs (B, Q, output_dim)` (`(N, output_dim)` with `query_packing`); or `(outputs, scores)` with
        `return_attention_scores=True`; or `(outputs, cache)` in cached mode.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import MultiHeadAttention
    >>> tokens = keras.Input(shape=(None, 64))
    >>> memory = keras.Input(shape=(None, 64))
    >>> outputs = MultiHeadAttention(num_heads=4)(tokens, memory)
    >>> model = keras.Model([tokens, memory], outputs)
    >>> model.output_shape
    (None, None, 64)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        attention_window=None,
        quantization_config=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        if attention_window is not None:
            check_positive_int("attention_window", attention_window)
        self.attention_window = attention_window
        for name, value in (
            ("key_dim", key_dim),
            ("value_dim", value_dim),
            ("output_dim", output_dim),
        ):
            if value is not None:
                check_positive_int(name, value)
        check_rate("dropout", dropout)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.quantization_config = quantization_config
        self.supports_masking = True
        self._dropout_layer = ReplicaDropout(
            dropout, dtype=self.dtype_policy, name="attention_dropout"
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        hidden_dim = query_shape[-1]
        value_width = hidden_dim if value_shape is None else value_shape[-1]
        key_width = value_width if key_shape is None else key_shape[-1]
        key_dim = self.key_dim
        if key_dim is None:
            if hidden_dim % self.num_heads:
                raise ValueError(
                    "num_heads must divide the model width when key_dim is not given. "
                    f"Received: num_heads={self.num_heads}, d_model={hidden_dim}"
                )
            key_dim = hidden_dim // self.num_heads
        value_dim = self.value_dim or key_dim
        output_dim = self.output_dim or hidden_dim
        self._key_dim, self._value_dim, self._output_dim = key_dim, value_dim, output_dim
        heads = self.num_heads
        kernel_shapes = {
            "query_kernel": (hidden_dim, heads, key_dim),
            "key_kernel": (key_width, heads, key_dim),
            "value_kernel": (value_width, heads, value_dim),
            "output_kernel": (heads, value_dim, output_dim),
        }
        if self.quantization_mode:  # e.g. rebuilt from the config of a quantized layer
            self.quantized_build(
                kernel_shapes, mode=self.quantization_mode, config=self.quantization_config
            )
        else:
            for name, shape in kernel_shapes.items():
                setattr(
                    self,
                    name,
                    self.add_weight(name=name, shape=shape, initializer=self.kernel_initializer),
                )
        if self.use_bias:
            self.query_bias = self._bias("query_bias", (heads, key_dim))
            self.key_bias = self._bias("key_bias", (heads, key_dim))
            self.value_bias = self._bias("value_bias", (heads, value_dim))
            self.output_bias = self._bias("output_bias", (output_dim,))
        self._dropout_layer.build(None)
        self.built = True

    def _bias(self, name, shape):
        return self.add_weight(name=name, shape=shape, initializer=self.bias_initializer)

    def _project(self, inputs, name, packing=None):
        """`inputs (B, T, D)` through the `name` ("query", "key", "value") projection: `(B, H, T, Dk)`.

        With a `packing` (see `layers.packing`), `inputs` are its `(N, D)` real positions:
        only they are projected, then laid out as `(B, H, T, Dk)` with zeros at the padding.
        """
        # Cast explicitly: `compute_cache` runs outside `__call__`, where Keras does not
        # autocast variables under mixed precision.
        dtype = self.compute_dtype
        inputs = ops.cast(inputs, dtype)
        kernel = getattr(self, f"{name}_kernel")
        # One matmul of all positions against the heads' kernels side by side, the bias added
        # to its rows, then the heads split off: on TensorFlow a MatMul, a bias add and a
        # transpose are faster, forward and backward, than one einsum to (B, H, T, Dk)
        # (docs/results-log.md, "The attention projections as matrix products").
        width, heads, depth = kernel.shape
        rows = ops.reshape(inputs, (-1, width))  # (B * T, D)
        if self.quantization_mode == "int8":
            scale = ops.reshape(getattr(self, f"{name}_kernel_scale"), (heads * depth,))
            projected = quantization.quantized_matmul(
                rows,
                ops.reshape(kernel, (width, heads * depth)),
                scale,
                self.inputs_quantizer,
                dtype,
            )
        else:
            projected = ops.matmul(
                rows, ops.reshape(ops.cast(kernel, dtype), (width, heads * depth))
            )
        if self.use_bias:  # (B * T, H * Dk)
            projected = projected + ops.reshape(
                ops.cast(getattr(self, f"{name}_bias"), dtype), (heads * depth,)
            )
        if (
            packing is not None
        ):  # (N, H * Dk) -> (B, H, T, Dk), the heads split off in the same gather
            return packing_lib.unpack_heads(projected, packing, heads)
        if (
            inputs.shape[1] == 1
        ):  # one position (a decoding step): (B, 1, H, Dk) is (B, H, 1, Dk) in memory
            return ops.reshape(projected, (-1, heads, 1, depth))
        shape = ops.shape(inputs)
        projected = ops.reshape(projected, (shape[0], shape[1], heads, depth))  # (B, T, H, Dk)
        return ops.transpose(projected, (0, 2, 1, 3))  # (B, H, T, Dk)

    def compute_cache(self, key_value_sequence, key_sequence=None):
        """Keys/values of a memory, computed once (encoder-decoder attention).

        Args:
            key_value_sequence: `(B, K, D)` memory (the encoder output).
            key_sequence: optional separate key memory; defaults to `key_value_sequence`.

        Returns:
            `{"key": (B, H, K, Dk), "value": (B, H, K, Dv)}`.
        """
        if key_sequence is None:
            key_sequence = key_value_sequence
        return {
            "key": self._project(key_sequence, "key"),
            "value": self._project(key_value_sequence, "value"),
        }

    def init_cache(self, batch_size, max_length):
        """An empty self-attention cache: zeros `{"key": (B, H, L, Dk), "value": (B, H, L, Dv)}`.

        With `attention_window=r` the buffer is a ring of `min(r, max_length)` slots (`r`
        when `max_length` is a tensor or `None`), whatever the number of positions decoded.
        `max_length=None` without a window: a growing cache, `{"past_key": (B, H, 0, Dk),
        "past_value": (B, H, 0, Dv)}`, that each call appends to (docs/architecture.md,
        "Attention modes").
        """
        return attention_cache.empty_cache(
            batch_size,
            max_length,
            self.num_heads,
            self._key_dim,
            self._value_dim,
            self.attention_window,
            self.compute_dtype,
        )

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        training=None,
        query_packing=None,
        key_packing=None,
    ):
        # One helper per mode (docs/architecture.md, "Attention modes"). A packing is a
        # layout of the inputs and outputs, which `_project` and `_output` read.
        if cache is None:
            if key_packing is not None:
                key_mask = key_packing[1]
            projected = self._project_all(query, value, key, query_packing, key_packing)
            key_mask = value_mask if key_mask is None else key_mask
            masks = (attention_mask, query_mask, key_mask, use_causal_mask)
            if self.attention_window:
                return self._call_windowed(
                    projected, masks, return_attention_scores, training, query_packing
                )
            return self._call_full(
                projected, masks, return_attention_scores, training, query_packing
            )
        self._check_cached_call(return_attention_scores, query_packing, key_packing)
        if cache_index is None:
            return self._call_shared_cache(
                query, cache, attention_mask, query_mask, key_mask, use_causal_mask, training
            )
        step = (query, value, key, cache, cache_index)
        if self.attention_window:
            return self._call_ring_cache(
                step, attention_mask, query_mask, use_causal_mask, training
            )
        return self._call_written_cache(step, attention_mask, query_mask, use_causal_mask, training)

    def _call_full(self, projected, masks, return_attention_scores, training, query_packing):
        """Plain (or packed) attention: every query against every key."""
        attention_mask, query_mask, key_mask, causal = masks
        heads, weights = self._attend(
            *projected, attention_mask, query_mask, key_mask, causal, 0, training
        )
        outputs = self._output(heads, query_packing)
        return (outputs, weights) if return_attention_scores else outputs

    def _call_windowed(self, projected, masks, return_attention_scores, training, query_packing):
        """Restricted self-attention: only the band's scores, in blocks (`windowed_attention`);
        with an `attention_mask` or for the scores, full attention under the band as a mask."""
        queries, keys, values = projected
        attention_mask, query_mask, key_mask, causal = masks
        query_length, key_length = queries.shape[2], keys.shape[2]
        if query_length is not None and key_length is not None and query_length != key_length:
            raise ValueError(
                "attention_window restricts self-attention: queries and keys must be the same "
                f"positions. Received: query length {query_length}, key length {key_length}"
            )
        if attention_mask is not None or return_attention_scores:
            band = self._with_band(attention_mask, queries, keys, causal)
            masks = (band, query_mask, key_mask, causal)
            return self._call_full(
                projected, masks, return_attention_scores, training, query_packing
            )
        dropout = (
            (lambda weights: self._dropout_layer(weights, training=training))
            if self.dropout
            else None
        )
        heads = windowed_attention(
            queries, keys, values, self.attention_window, causal, key_mask, dropout
        )
        return self._output(heads, query_packing)

    def _call_shared_cache(
        self, query, cache, attention_mask, query_mask, key_mask, causal, training
    ):
        """Encoder-decoder attention over `compute_cache`'s keys/values, reused every step.

        Query rows that are copies of the memory's rows (beam search) attend per memory row.
        """
        queries = self._project(query, "query")  # (N, H, Q, Dk)
        keys, values = cache["key"], cache["value"]
        rows, memory_rows = ops.shape(queries)[0], ops.shape(keys)[0]
        grouped = not (
            isinstance(rows, int) and isinstance(memory_rows, int) and rows == memory_rows
        )
        if grouped:
            queries = attention_cache.group_queries(queries, memory_rows)  # (B, H, C * Q, Dk)
            if attention_mask is not None:  # (B|1, Q, K) -> (B|1, C * Q, K)
                attention_mask = ops.tile(attention_mask, (1, rows // memory_rows, 1))
        if self.attention_window:
            attention_mask = self._with_band(attention_mask, queries, keys, causal)
        heads, _ = self._attend(
            queries, keys, values, attention_mask, query_mask, key_mask, causal, 0, training
        )
        if grouped:
            heads = attention_cache.ungroup_outputs(heads, rows, ops.shape(query)[1])
        return self._output(heads), cache

    def _call_ring_cache(self, step, attention_mask, query_mask, causal, training):
        """Cached restricted self-attention over a ring of `attention_window` slots
        (`attention_cache.ring_step`, whose mask holds the band and the causality)."""
        query, _, _, cache, cache_index = step
        queries, new_keys, new_values = self._project_step(step)
        keys, values, cache, attention_mask = attention_cache.ring_step(
            cache,
            new_keys,
            new_values,
            cache_index,
            ops.shape(query)[1],
            attention_mask,
            self.attention_window,
            causal,
        )
        heads, _ = self._attend(
            queries, keys, values, attention_mask, query_mask, None, False, 0, training
        )
        return self._output(heads), cache

    def _call_written_cache(self, step, attention_mask, query_mask, causal, training):
        """Cached self-attention: the new positions written into a preallocated buffer or
        appended to a growing cache (`attention_cache.write_step`), then attended over with
        the positions before them."""
        query, _, _, cache, cache_index = step
        queries, new_keys, new_values = self._project_step(step)
        keys, values, cache, attention_mask, causal = attention_cache.write_step(
            cache,
            new_keys,
            new_values,
            cache_index,
            ops.shape(query)[1],
            attention_mask,
            causal,
        )
        # No key mask: the causal mask (offset by cache_index) hides the unwritten slots.
        heads, _ = self._attend(
            queries, keys, values, attention_mask, query_mask, None, causal, cache_index, training
        )
        return self._output(heads), cache

    def _check_cached_call(self, return_attention_scores, query_packing, key_packing):
        if query_packing is not None or key_packing is not None:
            raise ValueError(
                "query_packing and key_packing are not available in cached mode. Received: a cache"
            )
        if return_attention_scores:
            raise ValueError(
                "return_attention_scores is not available in cached mode, which always "
                "returns (outputs, cache). Received: return_attention_scores=True with a cache."
            )

    def _project_all(self, query, value, key, query_packing, key_packing):
        """`(queries (B, H, Q, Dk), keys (B, H, K, Dk), values (B, H, K, Dv))` of an uncached call."""
        queries = self._project(query, "query", query_packing)
        if value is None:
            raise ValueError(
                "MultiHeadAttention needs `value` unless a cache is given. Received: value=None"
            )
        key = value if key is None else key
        keys = self._project(key, "key", key_packing)
        values = self._project(value, "value", key_packing)
        return queries, keys, values

    def _project_step(self, step):
        """Cached self-attention: the queries and the new positions' keys/values, these in
        the cache's dtype (`key` and `value` default to `query`)."""
        query, value, key, cache, _ = step
        queries = self._project(query, "query")  # (B, H, Q, Dk)
        key = query if key is None else key
        value = query if value is None else value
        key_buffer, value_buffer = attention_cache.buffers(cache)
        new_keys = ops.cast(self._project(key, "key"), key_buffer.dtype)
        new_values = ops.cast(self._project(value, "value"), value_buffer.dtype)
        return queries, new_keys, new_values

    def _with_band(self, attention_mask, queries, keys, causal):
        """`attention_mask` and the band of `attention_window` (`band_mask`) together."""
        band = band_mask(ops.shape(queries)[2], ops.shape(keys)[2], self.attention_window, causal)
        if attention_mask is None:
            return band
        return ops.logical_and(ops.cast(attention_mask, "bool"), band)

    def _attend(
        self,
        queries,
        keys,
        values,
        attention_mask,
        query_mask,
        key_mask,
        causal,
        causal_offset,
        training,
    ):
        """Attention of `queries (B, H, Q, Dk)` over `keys`/`values` under the merged masks:
        `(heads (B, H, Q, Dv), weights (B, H, Q, K) float32)`."""
        mask = masks_lib.merge_masks(
            ops.shape(queries)[2],
            ops.shape(keys)[2],
            query_padding_mask=query_mask,
            key_padding_mask=key_mask,
            attention_mask=attention_mask,
            causal=causal,
            causal_offset=causal_offset,
        )
        if mask is not None:
            mask = mask[:, None, :, :]  # (B|1, 1, Q, K) broadcast over heads
        weights = attention_weights(queries, keys, mask)
        dropped = self._dropout_layer(weights, training=training) if self.dropout else weights
        return ops.matmul(ops.cast(dropped, values.dtype), values), weights

    def _output(self, heads, packing=None):
        """`heads (B, H, Q, Dv)` side by side through the output projection: `(B, Q, D)` (see `_project`);
        with a `packing`, only its real positions: `(N, D)`."""
        heads_count, depth, width = self.output_kernel.shape
        if packing is not None:  # the real positions' heads side by side, one gather
            concatenated = packing_lib.pack_heads(heads, packing)  # (N, H * Dv)
        elif heads.shape[2] == 1:  # one query (a decoding step): (B, H, 1, Dv) is (B, 1, H * Dv)
            concatenated = ops.reshape(heads, (-1, heads_count * depth))  # (B, H * Dv)
        else:
            concatenated = ops.reshape(
                ops.transpose(heads, (0, 2, 1, 3)), (-1, heads_count * depth)
            )  # (B * Q, H * Dv)
        kernel = ops.reshape(self.output_kernel, (heads_count * depth, width))
        if self.quantization_mode == "int8":
            outputs = quantization.quantized_matmul(
                concatenated,
                kernel,
                self.output_kernel_scale,
                self.inputs_quantizer,
                self.compute_dtype,
            )
        else:
            outputs = ops.matmul(concatenated, kernel)
        if self.use_bias:
            outputs = outputs + self.output_bias
        if packing is not None:
            return outputs  # (N, D)
        shape = ops.shape(heads)
        return ops.reshape(outputs, (shape[0], shape[2], width))  # (B, Q, D)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "attention_window": self.attention_window,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "quantization_config": keras.saving.serialize_keras_object(
                    self.quantization_config
                ),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["quantization_config"] = keras.saving.deserialize_keras_object(
            config.get("quantization_config")
        )
        return super().from_config(config)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        **kwargs,
    ):
        # Symbolic calls return the same structure as eager ones: (outputs, cache) in
        # cached mode, (outputs, scores) with return_attention_scores.
        outputs = keras.KerasTensor(
            self.compute_output_shape(query.shape), dtype=self.compute_dtype
        )
        if cache is not None:
            return outputs, keras.tree.map_structure(
                lambda t: keras.KerasTensor(t.shape, dtype=t.dtype), cache
            )
        if return_attention_scores:
            key_length = (value if key is None else key).shape[1]
            scores_shape = (query.shape[0], self.num_heads, query.shape[1], key_length)
            return outputs, keras.KerasTensor(scores_shape, dtype="float32")
        return outputs

    # --- int8: Keras' quantization hooks (see `quantization`) ---

    # Kernel -> the axes its projection contracts: the scale has one entry per other index.
    KERNEL_REDUCED_AXES = {
        "query_kernel": (0,),
        "key_kernel": (0,),
        "value_kernel": (0,),
        "output_kernel": (0, 1),
    }

    def quantize(self, mode=None, type_check=True, config=None):
        if type_check and type(self) is not MultiHeadAttention:
            raise self._not_implemented_error(self.quantize)
        if mode not in quantization.MODES:
            raise self._quantization_mode_error(mode)
        self.quantization_config = config
        quantized = {
            name: quantization.quantize_kernel(getattr(self, name), axes, config)
            for name, axes in self.KERNEL_REDUCED_AXES.items()
        }
        kernel_shapes = {name: tuple(getattr(self, name).shape) for name in quantized}
        with quantization.one_garbage_collection():
            for name in quantized:
                delattr(self, name)  # untracks the float variable
        self.quantized_build(kernel_shapes, mode, config)
        for name, (values, scale) in quantized.items():
            getattr(self, name).assign(values)
            getattr(self, f"{name}_scale").assign(scale)
        self.dtype_policy = quantization.quantized_policy(self, mode)

    def quantized_build(self, kernel_shapes, mode, config=None):
        if mode != "int8":
            raise self._quantization_mode_error(mode)
        self._int8_build(kernel_shapes, config)
        self._is_quantized = True

    def _int8_build(self, kernel_shapes, config=None):
        self.inputs_quantizer = quantization.inputs_quantizer(config)
        for name, shape in kernel_shapes.items():
            reduced = self.KERNEL_REDUCED_AXES[name]
            scale_shape = tuple(size for axis, size in enumerate(shape) if axis not in reduced)
            kernel = self.add_weight(
                name=name, shape=shape, initializer="zeros", dtype="int8", trainable=False
            )
            setattr(self, name, kernel)
            scale = self.add_weight(
                name=f"{name}_scale", shape=scale_shape, initializer="ones", trainable=False
            )
            setattr(self, f"{name}_scale", scale)

    def _int8_call(self, *args, **kwargs):
        # The same computation: `_project` and `_output` read the int8 kernels.
        return self.call(*args, **kwargs)

    def _quantization_mode_error(self, mode):
        return quantization.mode_error(mode)

    @property
    def variable_serialization_spec(self):
        """Quantization mode -> the names of the variables `save_own_variables` writes, in order.

        `None` (float) is the order Keras wrote before the layer could be quantized (the
        kernels, then the biases), so existing `.keras` files load unchanged.
        """
        kernels = list(self.KERNEL_REDUCED_AXES)
        biases = [name.replace("_kernel", "_bias") for name in kernels] if self.use_bias else []
        return {
            None: kernels + biases,
            "int8": kernels + biases + [f"{name}_scale" for name in kernels],
        }

    def save_own_variables(self, store):
        quantization.save_variables(self, store)

    def load_own_variables(self, store):
        quantization.load_variables(self, store)
