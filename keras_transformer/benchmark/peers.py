"""The peer model: the same Transformer built from keras-hub's layers, on equal terms.

Equal terms: the same sizes and parameter count, the same dtype policy (every layer built
with it, so mixed precision computes in the same dtype on both sides), and the same dropout
placement -- `dropout` on the embedding + position sums and on every sub-layer output before
its residual add, `attention_dropout` on the attention probabilities (0 by default, as
ours). Settings the peer cannot express are refused by name.
"""

import keras
import keras_hub


def _set_attention_dropout(attention, rate):
    """Set a built `keras.layers.MultiHeadAttention`'s dropout on the attention probabilities.

    keras-hub's blocks pass their single `dropout` to both the sub-layer outputs and the
    attention probabilities; ours keep them apart (`dropout`, `attention_dropout`). Keras
    reads `_dropout` (whether to drop) and `_dropout_layer.rate` (how much) at call time.
    """
    attention._dropout = rate
    attention._dropout_layer.rate = rate


def attention_layers(block):
    """The `MultiHeadAttention` layers of a built keras-hub Transformer block."""
    names = ("_self_attention_layer", "_cross_attention_layer")
    return [getattr(block, name) for name in names if getattr(block, name, None) is not None]


def keras_hub_transformer(config, dtype=None):
    """An encoder-decoder with `config`'s sizes from `keras_hub.layers` (post-LN or pre-LN).

    Same inputs and outputs as our `Transformer`: `{"source_ids", "target_ids"}` -> float32
    logits. keras-hub has no tied encoder/decoder/output embedding, so it uses one
    `ReversibleEmbedding` for both sides and its reverse for the logits, plus
    `SinePositionEncoding` -- the same parameter count as ours.

    Args:
        config: a `TransformerConfig`.
        dtype: the dtype policy of every layer (e.g. "mixed_bfloat16"; default: the global
            policy), as `Transformer(config, dtype=...)`.

    Raises:
        ValueError: for `activation_dropout > 0` (keras-hub's feed-forward has no inner
            dropout), `attention_window`, key/value widths other than hidden_dim / num_heads,
            separate or untied embeddings, a target vocabulary of its own, a logits bias,
            learned positions or concatenated sinusoids.
    """
    if config.activation_dropout:
        raise ValueError(
            "The keras-hub peer has no dropout inside the feed-forward network. "
            f"Received: activation_dropout={config.activation_dropout}"
        )
    if getattr(config, "attention_window", None) is not None:
        raise ValueError(
            f"The keras-hub peer has no restricted self-attention. Received: attention_window={config.attention_window}"
        )
    # One embedding of vocabulary_size rows, shared by both sides and the output projection;
    # keras-hub's interleaved sinusoids; no logits bias.
    expressible = {
        "target_vocabulary_size": None,
        "share_embeddings": True,
        "tie_output": True,
        "final_logits_bias": False,
        "positional": "sinusoidal",
        "sinusoid_layout": "interleaved",
    }
    for name, value in expressible.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"The keras-hub peer has {name}={value!r} only. "
                f"Received: {name}={getattr(config, name)!r}"
            )
    for name in ("key_dim", "value_dim"):
        value = getattr(config, name)
        if value is not None and value * config.num_heads != config.hidden_dim:
            raise ValueError(
                f"The keras-hub peer's heads are hidden_dim / num_heads wide. Received: {name}={value}"
            )
    policy = keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
    embedding = keras_hub.layers.ReversibleEmbedding(
        config.vocabulary_size,
        config.hidden_dim,
        mask_zero=True,
        dtype=policy,
        name="token_embedding",
    )
    positions = keras_hub.layers.SinePositionEncoding(dtype=policy, name="position_encoding")

    def embed(ids, side):
        hidden = embedding(ids)
        hidden = keras.layers.Add(dtype=policy, name=f"{side}_embedding_sum")(
            [hidden, positions(hidden)]
        )
        return keras.layers.Dropout(config.dropout, dtype=policy, name=f"{side}_embedding_dropout")(
            hidden
        )

    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
    block = dict(
        intermediate_dim=config.intermediate_dim,
        num_heads=config.num_heads,
        dropout=config.dropout,
        activation=config.activation,
        layer_norm_epsilon=config.layer_norm_epsilon,
        normalize_first=config.normalize_first,
        dtype=policy,
    )
    blocks = []
    hidden = embed(source_ids, "source")
    for index in range(config.num_encoder_layers):
        blocks.append(keras_hub.layers.TransformerEncoder(name=f"encoder_{index}", **block))
        hidden = blocks[-1](hidden)
    if config.normalize_first:  # ours ends each pre-LN stack with a LayerNorm
        hidden = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype=policy, name="encoder_final_layer_norm"
        )(hidden)
    encoded = hidden
    hidden = embed(target_ids, "target")
    for index in range(config.num_decoder_layers):
        blocks.append(keras_hub.layers.TransformerDecoder(name=f"decoder_{index}", **block))
        hidden = blocks[-1](hidden, encoded)
    if config.normalize_first:
        hidden = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype=policy, name="decoder_final_layer_norm"
        )(hidden)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(
        embedding(hidden, reverse=True)
    )
    for built in blocks:
        for attention in attention_layers(built):
            _set_attention_dropout(attention, config.attention_dropout)
    return keras.Model(
        {"source_ids": source_ids, "target_ids": target_ids}, logits, name="keras_hub_transformer"
    )


class PeerTargetRows:
    """The keras-hub peer with our training output (`Transformer.real_target_logits`): its
    decoder's output gathered at the target's real positions before its output projection,
    so that its logits and loss skip the target's padding as ours do (the keras_hub_target_rows row).

    Same weights as `peer`; `real_target_logits` and `trainable_variables` are all that
    `training.loss.labels_and_logits` and `benchmark.timing.make_train_step` use.

    Args:
        peer: a model from `keras_hub_transformer(config)`.
        config: its `TransformerConfig`.
    """

    def __init__(self, peer, config):
        last = (
            "decoder_final_layer_norm"
            if config.normalize_first
            else f"decoder_{config.num_decoder_layers - 1}"
        )
        self.decoder_output = keras.Model(
            peer.input, peer.get_layer(last).output, name="keras_hub_decoder_output"
        )
        self.embedding = peer.get_layer("token_embedding")
        self.trainable_variables = peer.trainable_variables

    def real_target_logits(self, inputs, labels, training=None):
        """`(labels (N,), logits (N, V))` on the real target positions (every position under XLA,
        as ours: `layers.packing.packed_positions`)."""
        from keras import ops

        from keras_transformer.data.tokenizer import PAD_ID
        from keras_transformer.layers import packing
        from keras_transformer.layers.masks import padding_mask

        hidden = self.decoder_output(inputs, training=training)  # (B, T, D)
        positions = packing.packed_positions(padding_mask(inputs["target_ids"], PAD_ID))
        rows = packing.pack(
            hidden, (positions, None)
        )  # (N, D), gathered as ours (gathers both ways)
        logits = ops.cast(self.embedding(rows, reverse=True), "float32")
        return ops.take(ops.reshape(labels, (-1,)), positions, axis=0), logits


def keras_hub_beam_search(model, source_ids, beam_size, max_output_offset):
    """keras-hub's generation driving our model: `keras_hub.samplers.BeamSampler` over
    `model.decode_step` with the preallocated key/value cache, on any backend.

    The sampler's own algorithm (docs/keras_hub.md): every beam goes on after its stop token
    until every beam of the batch has produced one or the buffer (`S + max_output_offset`)
    is full, ranked by summed log-probability. It repeats and reorders the whole cache,
    the encoder-decoder keys/values and the source mask included, for each beam.

    Returns:
        int32 `(B, L)`: the best beam's tokens after BOS (EOS then whatever the beam went on
        with; cut at the first EOS to read it).
    """
    from keras import ops

    from keras_transformer.data.tokenizer import BOS_ID, EOS_ID
    from keras_transformer.decoding import lengths

    source_ids = lengths.as_source_ids(source_ids)
    batch_size = source_ids.shape[0]
    buffer_size = lengths.buffer_length(model, source_ids, None, max_output_offset)
    encoder_outputs, source_mask = model.encode(source_ids)
    cache = {"layers": model.init_cache(encoder_outputs, buffer_size), "source_mask": source_mask}
    prompt = ops.concatenate(
        [ops.full((batch_size, 1), BOS_ID, "int32"), ops.zeros((batch_size, buffer_size), "int32")],
        axis=1,
    )
    given = ops.arange(buffer_size + 1)[None, :] < 1  # only BOS is given

    def next_logits(prompt, cache, index):  # the token at `index` from the one before it
        tokens = ops.slice(prompt, (0, index - 1), (ops.shape(prompt)[0], 1))
        logits, layers = model.decode_step(tokens, cache["layers"], index - 1, cache["source_mask"])
        return logits[:, 0, :], None, {"layers": layers, "source_mask": cache["source_mask"]}

    sampler = keras_hub.samplers.BeamSampler(num_beams=beam_size)
    generated = sampler(
        next_logits,
        prompt,
        cache=cache,
        index=1,
        mask=ops.broadcast_to(given, ops.shape(prompt)),
        stop_token_ids=(EOS_ID,),
    )
    return generated[:, 1:]
