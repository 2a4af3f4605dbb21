"""The decoder layer (paper section 3.1): masked self-attention, encoder-decoder attention, FFN.

Shape letters: B batch, T target length, S source length, L cache length, D model width,
H heads.
"""

import keras
from keras import ops

from keras_transformer.layers import masks as masks_lib
from keras_transformer.layers.block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(TransformerBlock):
    """One decoder layer: masked self-attention, encoder-decoder attention, position-wise FFN.

    Sub-layers are wrapped post-LN as in the paper (pre-LN with `normalize_first=True`).
    Self-attention is causal by default: position t sees target positions <= t only.
    Padding masks come from the explicit arguments or from Keras implicit masks on
    `decoder_sequence` / `encoder_sequence`.

    **Incremental decoding.** `init_cache(encoder_sequence, max_length)` returns
    `{"self": ..., "cross": ...}`: an empty preallocated self-attention buffer of
    `max_length` slots and the encoder-decoder keys/values, computed once. Calling the
    block with `cache=` and `cache_index=` (the position of the first new target token)
    writes the new keys/values into the buffer and returns `(outputs, cache)`, every time.
    With `attention_window=r` the self-attention buffer is a ring of `min(r, max_length)`
    slots; without one, `max_length=None` gives a growing cache that holds exactly the
    positions decoded so far (see `MultiHeadAttention`).

    Args:
        num_heads: attention heads H (must divide D unless `key_dim` is given).
        intermediate_dim: FFN inner width (d_ff).
        key_dim: per-head query/key width; defaults to D / H.
        value_dim: per-head value width; defaults to `key_dim`.
        dropout: P_drop, on each sub-layer output before the residual add.
        attention_dropout: dropout on attention weights (0 in the paper).
        activation_dropout: dropout inside the FFN (0 in the paper).
        activation: FFN activation ("relu" in the paper).
        layer_norm_epsilon: epsilon of the layer normalizations.
        normalize_first: pre-LN instead of the paper's post-LN.
        kernel_initializer: initializer of all kernels.
        bias_initializer: initializer of all biases.
        attention_window: restricted self-attention (paper Table 1): each position attends
            only to itself and the `attention_window - 1` positions before it, computed in
            blocks with O(T * window) cost (see `MultiHeadAttention`); cross-attention stays
            full. `None`: full attention.

    Call arguments:
        decoder_sequence: `(B, T, D)` target-side inputs.
        encoder_sequence: `(B, S, D)` encoder outputs (may be `None` with a cache).
        decoder_padding_mask: optional bool `(B, T)`.
        decoder_attention_mask: optional bool `(B, T, T)` for self-attention.
        encoder_padding_mask: optional bool `(B, S)`.
        encoder_attention_mask: optional bool `(B, T, S)` for encoder-decoder attention.
        use_causal_mask: causal self-attention (default True).
        cache: optional `{"self": {"key", "value"}, "cross": {"key", "value"}}`.
        cache_index: int scalar, position of `decoder_sequence[:, 0]` in the cache.
        return_attention_scores: also return `{"self": (B, H, T, T), "cross": (B, H, T, S)}`.
        training: whether dropout is active.
        decoder_packing: optional packing `(positions, mask)` of the `(B, T)` target batch
            (`layers.packing`): `decoder_sequence` and the outputs are then `(N, D)`, the
            rows of its N real positions, and every position-wise step computes on those
            rows only; `mask` is the decoder padding mask.
        encoder_packing: the same for `encoder_sequence` (`(N_S, D)` rows of the `(B, S)`
            source batch); its mask is the encoder padding mask.

    Returns:
        `(B, T, D)`; `(outputs, scores)` with `return_attention_scores=True`;
        `(outputs, cache)` in cached mode.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import DecoderBlock, EncoderBlock
    >>> source = keras.Input(shape=(None, 32))
    >>> target = keras.Input(shape=(None, 32))
    >>> memory = EncoderBlock(num_heads=4, intermediate_dim=64)(source)
    >>> hidden = DecoderBlock(num_heads=4, intermediate_dim=64)(target, memory)
    >>> keras.Model([source, target], hidden).output_shape
    (None, None, 32)

    References:
        Vaswani et al., 2017, section 3.1.
    """

    SUBLAYERS = ("self_attention", "cross_attention", "feed_forward")

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        if encoder_sequence_shape is None:
            encoder_sequence_shape = decoder_sequence_shape
        self.self_attention.build(decoder_sequence_shape, decoder_sequence_shape)
        self.cross_attention.build(decoder_sequence_shape, encoder_sequence_shape)
        self.feed_forward.build(decoder_sequence_shape)
        self._build_norms_and_dropouts(decoder_sequence_shape)
        self.built = True

    def init_cache(self, encoder_sequence, max_length):
        """Empty self-attention buffer of `max_length` slots (`min(r, max_length)` with
        `attention_window=r`; growing with `max_length=None`) plus encoder-decoder keys/values."""
        batch_size = ops.shape(encoder_sequence)[0]
        return {
            "self": self.self_attention.init_cache(batch_size, max_length),
            "cross": self.cross_attention.compute_cache(encoder_sequence),
        }

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        use_causal_mask=True,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
        decoder_packing=None,
        encoder_packing=None,
    ):
        cached = cache is not None
        if cached and cache_index is None:
            raise ValueError(
                "DecoderBlock needs `cache_index` together with `cache`. Received: cache_index=None"
            )
        if not cached and encoder_sequence is None:
            raise ValueError(
                "DecoderBlock needs `encoder_sequence` unless a cache is given. Received: encoder_sequence=None"
            )
        if cached and (decoder_packing is not None or encoder_packing is not None):
            raise ValueError(
                "DecoderBlock's packings are not available in cached mode. Received: a cache"
            )
        if decoder_packing is not None:
            decoder_padding_mask = decoder_packing[1]
        elif decoder_padding_mask is None and not cached:
            decoder_padding_mask = masks_lib.implicit_mask(decoder_sequence)
        if encoder_packing is not None:
            encoder_padding_mask = encoder_packing[1]
        elif encoder_padding_mask is None and encoder_sequence is not None:
            encoder_padding_mask = masks_lib.implicit_mask(encoder_sequence)

        def self_attention(x):
            if cached:
                return self.self_attention(
                    x,
                    attention_mask=decoder_attention_mask,
                    use_causal_mask=use_causal_mask,
                    cache=cache["self"],
                    cache_index=cache_index,
                    training=training,
                )
            result = self.self_attention(
                x,
                x,
                key_mask=decoder_padding_mask,
                attention_mask=decoder_attention_mask,
                use_causal_mask=use_causal_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                query_packing=decoder_packing,
                key_packing=decoder_packing,
            )
            return result if return_attention_scores else (result, None)

        def cross_attention(x):
            if cached:
                return self.cross_attention(
                    x,
                    key_mask=encoder_padding_mask,
                    attention_mask=encoder_attention_mask,
                    cache=cache["cross"],
                    training=training,
                )
            result = self.cross_attention(
                x,
                encoder_sequence,
                key_mask=encoder_padding_mask,
                attention_mask=encoder_attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                query_packing=decoder_packing,
                key_packing=encoder_packing,
            )
            return result if return_attention_scores else (result, None)

        # Each sub-layer's extra result is its cache in cached mode, else its scores (or None).
        hidden, self_extra = self._sublayer(
            decoder_sequence, "self_attention", self_attention, training
        )
        hidden, cross_extra = self._sublayer(hidden, "cross_attention", cross_attention, training)
        outputs = self._feed_forward(hidden, training)  # (B, T, D)
        if cached or return_attention_scores:
            return outputs, {"self": self_extra, "cross": cross_extra}
        return outputs

    def compute_output_shape(self, decoder_sequence_shape, encoder_sequence_shape=None):
        return decoder_sequence_shape

    def compute_output_spec(
        self,
        decoder_sequence,
        encoder_sequence=None,
        cache=None,
        return_attention_scores=False,
        **kwargs,
    ):
        # Symbolic calls return the same structure as eager ones: (outputs, cache) in
        # cached mode, (outputs, {"self", "cross"} scores) with return_attention_scores.
        outputs = keras.KerasTensor(
            self.compute_output_shape(decoder_sequence.shape), dtype=self.compute_dtype
        )
        if cache is not None:
            return outputs, keras.tree.map_structure(
                lambda t: keras.KerasTensor(t.shape, dtype=t.dtype), cache
            )
        if return_attention_scores:
            batch_size, target_length = decoder_sequence.shape[0], decoder_sequence.shape[1]
            source_length = encoder_sequence.shape[1]
            scores = {
                "self": keras.KerasTensor(
                    (batch_size, self.num_heads, target_length, target_length), dtype="float32"
                ),
                "cross": keras.KerasTensor(
                    (batch_size, self.num_heads, target_length, source_length), dtype="float32"
                ),
            }
            return outputs, scores
        return outputs
