"""The encoder layer (paper section 3.1): self-attention and a feed-forward network.

Shape letters: B batch, S source length, D model width, H heads.
"""

import keras

from keras_transformer.layers import masks as masks_lib
from keras_transformer.layers.block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(TransformerBlock):
    """One encoder layer: multi-head self-attention, then a position-wise FFN.

    Each sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))) (post-LN, the paper's
    arrangement) or, with `normalize_first=True`, x + Dropout(Sublayer(LayerNorm(x)))
    (pre-LN; a stack of pre-LN blocks needs a final LayerNorm, which `Transformer` adds).
    Padded source positions are never attended to; the padding mask comes from
    `padding_mask` or from a Keras implicit mask on the inputs, whichever is given.
    (Add positions with `keras.layers.Add()`, which keeps the implicit mask; `+` drops it.)

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
            only to the positions at distance < `attention_window` on either side, computed in
            blocks with O(S * window) cost (see `MultiHeadAttention`). `None`: full attention.

    Call arguments:
        inputs: `(B, S, D)`.
        padding_mask: optional bool `(B, S)`, True at real tokens.
        attention_mask: optional bool `(B, S, S)`, True = may attend.
        return_attention_scores: also return the self-attention weights `(B, H, S, S)`.
        training: whether dropout is active.
        packing: optional packing `(positions, mask)` of the `(B, S)` batch (`layers.packing`):
            `inputs` and outputs are then `(N, D)`, the rows of its N real positions, and
            every position-wise step computes on those rows only; `mask` is the padding mask.

    Returns:
        `(B, S, D)`, or `(outputs, scores)` with `return_attention_scores=True`.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import EncoderBlock, PositionalEncoding, SharedEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> hidden = SharedEmbedding(vocabulary_size=100, embedding_dim=32)(ids)
    >>> hidden = keras.layers.Add()([hidden, PositionalEncoding()(hidden)])  # keeps the mask
    >>> hidden = EncoderBlock(num_heads=4, intermediate_dim=64)(hidden)  # padding masked
    >>> pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    >>> outputs = keras.layers.Dense(2)(pooled)
    >>> keras.Model(ids, outputs).output_shape
    (None, 2)

    References:
        Vaswani et al., 2017, section 3.1; Xiong et al., 2020 (pre-LN).
    """

    SUBLAYERS = ("self_attention", "feed_forward")

    def build(self, input_shape):
        self.self_attention.build(input_shape, input_shape)
        self.feed_forward.build(input_shape)
        self._build_norms_and_dropouts(input_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        packing=None,
    ):
        if packing is not None:
            padding_mask = packing[1]
        elif padding_mask is None:
            padding_mask = masks_lib.implicit_mask(inputs)

        def self_attention(x):
            result = self.self_attention(
                x,
                x,
                key_mask=padding_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                query_packing=packing,
                key_packing=packing,
            )
            return result if return_attention_scores else (result, None)

        hidden, scores = self._sublayer(inputs, "self_attention", self_attention, training)
        outputs = self._feed_forward(hidden, training)  # (B, S, D)
        if return_attention_scores:
            return outputs, scores
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, return_attention_scores=False, **kwargs):
        # Symbolic calls return (outputs, scores) with return_attention_scores, as eager ones do.
        outputs = keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=self.compute_dtype
        )
        if return_attention_scores:
            batch_size, length = inputs.shape[0], inputs.shape[1]
            return outputs, keras.KerasTensor(
                (batch_size, self.num_heads, length, length), dtype="float32"
            )
        return outputs
