"""The peer model: the same Transformer built from keras-hub's layers."""

import keras
import keras_hub


def keras_hub_transformer(config):
    """An encoder-decoder with `config`'s sizes from `keras_hub.layers` (post-LN, ReLU).

    Same inputs and outputs as our `Transformer`: `{"source_ids", "target_ids"}` -> float32
    logits. keras-hub has no tied encoder/decoder/output embedding, so it uses one
    `ReversibleEmbedding` for both sides and its reverse for the logits, plus
    `SinePositionEncoding` -- the same parameter count as ours.
    """
    embedding = keras_hub.layers.ReversibleEmbedding(
        config.vocabulary_size, config.hidden_dim, mask_zero=True, name="token_embedding"
    )
    positions = keras_hub.layers.SinePositionEncoding()

    def embed(ids):
        hidden = embedding(ids)
        return keras.layers.Dropout(config.dropout)(keras.layers.Add()([hidden, positions(hidden)]))

    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
    block = dict(
        intermediate_dim=config.intermediate_dim,
        num_heads=config.num_heads,
        dropout=config.dropout,
        activation=config.activation,
        layer_norm_epsilon=config.layer_norm_epsilon,
        normalize_first=config.normalize_first,
    )
    hidden = embed(source_ids)
    for index in range(config.num_encoder_layers):
        hidden = keras_hub.layers.TransformerEncoder(name=f"encoder_{index}", **block)(hidden)
    encoded = hidden
    hidden = embed(target_ids)
    for index in range(config.num_decoder_layers):
        hidden = keras_hub.layers.TransformerDecoder(name=f"decoder_{index}", **block)(hidden, encoded)
    logits = keras.layers.Activation("linear", dtype="float32")(embedding(hidden, reverse=True))
    return keras.Model({"source_ids": source_ids, "target_ids": target_ids}, logits, name="keras_hub_transformer")
