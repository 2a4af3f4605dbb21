"""The model configuration: one frozen, validated dataclass and a table of presets.

Presets are data (one row per preset in `PRESETS`), variants are `dataclasses.replace`.
Names follow Keras (`hidden_dim` is the paper's d_model, `intermediate_dim` its d_ff,
`key_dim`/`value_dim` its d_k/d_v, `dropout` its P_drop, `label_smoothing` its epsilon_ls).
"""

import dataclasses

import keras

from keras_transformer.layers.checks import (
    check_non_negative_int,
    check_non_negative_number,
    check_positive_int,
    check_rate,
)
from keras_transformer.layers.positional import LAYOUTS as SINUSOID_LAYOUTS

POSITIONAL_KINDS = ("sinusoidal", "learned")
LEARNING_RATE_DECAYS = ("rsqrt", "linear", "cosine")  # see training.schedule.TransformerSchedule
TOKENIZER_TYPES = ("unigram", "bpe")  # SentencePiece model types a run's tokenizer is trained with


def check_learning_rate_decay(decay, warmup_steps, train_steps, name="learning_rate_decay"):
    """Raises ValueError (naming the argument `name`) unless `decay` is known and, for the
    decays that end at `train_steps`, `train_steps > warmup_steps`."""
    if decay not in LEARNING_RATE_DECAYS:
        raise ValueError(
            f"{name} must be one of {LEARNING_RATE_DECAYS}. Received: {name}={decay!r}"
        )
    if decay != "rsqrt" and (train_steps is None or train_steps <= warmup_steps):
        raise ValueError(
            f"{name}={decay!r} needs train_steps > warmup_steps. "
            f"Received: train_steps={train_steps}, warmup_steps={warmup_steps}"
        )


def check_activation(activation):
    """Raises ValueError naming `activation` unless Keras knows it (`keras.activations.get`)."""
    try:
        keras.activations.get(activation)
    except (ValueError, TypeError):
        raise ValueError(
            "activation must be a Keras activation name (relu, gelu, silu, ...). "
            f"Received: activation={activation!r}"
        ) from None


# Fields a checkpoint depends on; the others (dropout, schedule, decoding) may change on resume.
ARCHITECTURE_FIELDS = (
    "vocabulary_size",
    "num_encoder_layers",
    "num_decoder_layers",
    "hidden_dim",
    "intermediate_dim",
    "num_heads",
    "key_dim",
    "value_dim",
    "activation",
    "layer_norm_epsilon",
    "normalize_first",
    "positional",
    "sinusoid_layout",
    "max_length",
    "share_embeddings",
    "tie_output",
    "final_logits_bias",
    "target_vocabulary_size",
)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Everything that defines a Transformer and the paper's training recipe for it.

    Model:
        vocabulary_size: shared source/target vocabulary (37,000 BPE tokens in the paper).
        target_vocabulary_size: the decoder's own vocabulary (its embedding rows and its
            logits), for a model whose target side has another vocabulary than its source
            (some OPUS-MT checkpoints); needs `share_embeddings=False`. `None` (the paper):
            the shared `vocabulary_size`. `decoder_vocabulary_size` is the one in use.
        tokenizer_type: the SentencePiece model a new run trains for that vocabulary:
            "unigram" (the default) or "bpe" (the paper's byte-pair encoding). Not part of
            the architecture: a resumed run keeps the tokenizer it has.
        num_encoder_layers, num_decoder_layers: N.
        hidden_dim: d_model.
        intermediate_dim: d_ff.
        num_heads: h.
        key_dim, value_dim: d_k, d_v per head; `None` means hidden_dim / num_heads.
        dropout: P_drop on sub-layer outputs and on embedding + position sums.
        attention_dropout, activation_dropout: extra dropouts (0 in the paper).
        attention_window: restricted self-attention (paper Table 1, section 7): encoder and
            decoder self-attention see only the positions at distance < r (the decoder:
            itself and the r - 1 before it), in O(n * r) instead of O(n^2); `None` (the
            paper's models): full attention.
        activation: FFN activation, a Keras activation name: "relu" (paper), "gelu",
            "silu" (Marian's "swish"), ...
        layer_norm_epsilon: LayerNorm epsilon.
        normalize_first: pre-LN (False = the paper's post-LN).
        positional: "sinusoidal" (paper) or "learned" (Table 3 row E).
        sinusoid_layout: the sinusoids' features, "interleaved" (the paper's formula: sin at
            even features, cos at odd ones) or "concatenated" (Marian's: the D / 2 sines,
            then the D / 2 cosines of the same frequencies).
        max_length: longest source/target sequence in tokens (learned positions, buffers).
        share_embeddings: one embedding matrix for source and target tokens.
        tie_output: reuse the target embedding matrix as the pre-softmax projection.
        final_logits_bias: a learned bias, one per output token, added to the logits after
            the output projection (Marian's `final_logits_bias`; the paper: none).
        skip_padding: on TensorFlow, the model's forward pass (`model(inputs)`: training
            and teacher-forced scoring) computes every position-wise step -- projections,
            feed-forward, layer norm, dropout, residuals -- on the real tokens only
            (`layers.packing`); the same values at every real position. Not part of the
            architecture: a run may change it on resume. False: on the padded batch.

    Training and decoding (the paper's values by default):
        label_smoothing: epsilon_ls.
        warmup_steps: of the learning-rate schedule.
        learning_rate_scale: constant multiplier of the paper's schedule (1.0 in the paper).
        learning_rate_decay: after warmup, "rsqrt" (the paper's inverse square root), or
            "linear" / "cosine" from the same peak down to 0 at `train_steps`.
        train_steps: total training steps.
        beam_size, length_penalty, max_output_offset: beam search settings
            (max output length = source length + offset).
        average_checkpoints: how many last checkpoints to average.
    """

    vocabulary_size: int = 37000
    tokenizer_type: str = "unigram"
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    hidden_dim: int = 512
    intermediate_dim: int = 2048
    num_heads: int = 8
    key_dim: int | None = None
    value_dim: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    attention_window: int | None = None
    activation_dropout: float = 0.0
    activation: str = "relu"
    layer_norm_epsilon: float = 1e-6
    normalize_first: bool = False
    positional: str = "sinusoidal"
    sinusoid_layout: str = "interleaved"
    max_length: int = 256
    share_embeddings: bool = True
    tie_output: bool = True
    final_logits_bias: bool = False
    target_vocabulary_size: int | None = None
    skip_padding: bool = True
    label_smoothing: float = 0.1
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    learning_rate_decay: str = "rsqrt"
    train_steps: int = 100000
    beam_size: int = 4
    length_penalty: float = 0.6
    max_output_offset: int = 50
    average_checkpoints: int = 5

    # Not a field: the names `architecture` returns (a subclass adds its own).
    architecture_fields = ARCHITECTURE_FIELDS

    def __post_init__(self):
        for name in (
            "vocabulary_size",
            "num_encoder_layers",
            "num_decoder_layers",
            "hidden_dim",
            "intermediate_dim",
            "num_heads",
            "max_length",
            "warmup_steps",
            "train_steps",
            "beam_size",
            "average_checkpoints",
        ):
            check_positive_int(name, getattr(self, name))
        for name in ("key_dim", "value_dim", "attention_window", "target_vocabulary_size"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.key_dim is None and self.hidden_dim % self.num_heads:
            raise ValueError(
                "num_heads must divide hidden_dim (d_model) when key_dim is not given. "
                f"Received: num_heads={self.num_heads}, hidden_dim={self.hidden_dim}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            check_rate(name, getattr(self, name))
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise ValueError(
                f"tokenizer_type must be one of {TOKENIZER_TYPES}. Received: tokenizer_type={self.tokenizer_type!r}"
            )
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                f"positional must be one of {POSITIONAL_KINDS}. Received: positional={self.positional!r}"
            )
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            raise ValueError(
                f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}. Received: sinusoid_layout={self.sinusoid_layout!r}"
            )
        if self.sinusoid_layout != "interleaved" and self.positional != "sinusoidal":
            raise ValueError(
                "sinusoid_layout applies to sinusoidal positions. Received: "
                f"sinusoid_layout={self.sinusoid_layout!r}, positional={self.positional!r}"
            )
        check_activation(self.activation)
        if not isinstance(self.final_logits_bias, bool):
            raise ValueError(
                f"final_logits_bias must be True or False. Received: final_logits_bias={self.final_logits_bias!r}"
            )
        if self.share_embeddings and self.decoder_vocabulary_size != self.vocabulary_size:
            raise ValueError(
                "A target vocabulary of its own needs share_embeddings=False. Received: "
                f"target_vocabulary_size={self.target_vocabulary_size}, "
                f"vocabulary_size={self.vocabulary_size}, share_embeddings=True"
            )
        if not self.layer_norm_epsilon > 0:
            raise ValueError(
                f"layer_norm_epsilon must be positive. Received: layer_norm_epsilon={self.layer_norm_epsilon!r}"
            )
        check_learning_rate_decay(self.learning_rate_decay, self.warmup_steps, self.train_steps)
        if not self.learning_rate_scale > 0:
            raise ValueError(
                f"learning_rate_scale must be positive. Received: learning_rate_scale={self.learning_rate_scale!r}"
            )
        check_non_negative_number("length_penalty", self.length_penalty)
        check_non_negative_int("max_output_offset", self.max_output_offset)

    @property
    def decoder_vocabulary_size(self):
        """The target side's vocabulary (decoder embedding rows, logits): `target_vocabulary_size`
        or the shared `vocabulary_size`."""
        return self.target_vocabulary_size or self.vocabulary_size

    @property
    def head_key_dim(self):
        """d_k actually used: `key_dim` or hidden_dim / num_heads."""
        return self.key_dim or self.hidden_dim // self.num_heads

    @property
    def head_value_dim(self):
        """d_v actually used: `value_dim` or `head_key_dim`."""
        return self.value_dim or self.head_key_dim

    def architecture(self):
        """The fields that define the weights and the graph (not training or decoding settings)."""
        return {name: getattr(self, name) for name in self.architecture_fields}

    def replace(self, **changes):
        """A copy with `changes` applied (and validated). Unknown field names raise ValueError."""
        unknown = sorted(set(changes) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            raise ValueError(
                f"Unknown config field(s) {unknown}. Valid fields: {sorted(self.to_dict())}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        return cls().replace(**values)


# 4+4 layers, d_model 128, d_ff 256, 4 heads: the CPU presets `tiny` and `multi30k`.
TINY_ARCHITECTURE = dict(
    vocabulary_size=8000,
    num_encoder_layers=4,
    num_decoder_layers=4,
    hidden_dim=128,
    intermediate_dim=256,
    num_heads=4,
    max_length=128,
)

# Each preset: its description and the fields it changes from the defaults (= "base").
# Table 3 rows keep base's other settings; rows (A) keep h * d_k = d_model (constant compute).
PRESETS = {
    "base": ("Transformer (base), Table 3 first row: ~65M parameters", {}),
    "big": (
        "Transformer (big): d_model 1024, d_ff 4096, 16 heads, P_drop 0.3, ~213M parameters",
        dict(
            hidden_dim=1024,
            intermediate_dim=4096,
            num_heads=16,
            dropout=0.3,
            train_steps=300000,
            average_checkpoints=20,
        ),
    ),
    "table3_a_h1": ("Table 3 (A): h=1, d_k=d_v=512", dict(num_heads=1)),
    "table3_a_h4": ("Table 3 (A): h=4, d_k=d_v=128", dict(num_heads=4)),
    "table3_a_h16": ("Table 3 (A): h=16, d_k=d_v=32", dict(num_heads=16)),
    "table3_a_h32": ("Table 3 (A): h=32, d_k=d_v=16", dict(num_heads=32)),
    "table3_b_dk16": ("Table 3 (B): d_k=16 (d_v=64)", dict(key_dim=16, value_dim=64)),
    "table3_b_dk32": ("Table 3 (B): d_k=32 (d_v=64)", dict(key_dim=32, value_dim=64)),
    "table3_c_n2": ("Table 3 (C): N=2", dict(num_encoder_layers=2, num_decoder_layers=2)),
    "table3_c_n4": ("Table 3 (C): N=4", dict(num_encoder_layers=4, num_decoder_layers=4)),
    "table3_c_n8": ("Table 3 (C): N=8", dict(num_encoder_layers=8, num_decoder_layers=8)),
    "table3_c_d256": ("Table 3 (C): d_model=256, d_k=d_v=32", dict(hidden_dim=256)),
    "table3_c_d1024": ("Table 3 (C): d_model=1024, d_k=d_v=128", dict(hidden_dim=1024)),
    "table3_c_dff1024": ("Table 3 (C): d_ff=1024", dict(intermediate_dim=1024)),
    "table3_c_dff4096": ("Table 3 (C): d_ff=4096", dict(intermediate_dim=4096)),
    "table3_d_drop0": ("Table 3 (D): P_drop=0.0", dict(dropout=0.0)),
    "table3_d_drop02": ("Table 3 (D): P_drop=0.2", dict(dropout=0.2)),
    "table3_d_ls0": ("Table 3 (D): epsilon_ls=0.0", dict(label_smoothing=0.0)),
    "table3_d_ls02": ("Table 3 (D): epsilon_ls=0.2", dict(label_smoothing=0.2)),
    "table3_e_learned": (
        "Table 3 (E): learned positional embedding instead of sinusoids",
        dict(positional="learned"),
    ),
    "tiny": (
        "CPU preset: 4+4 layers, d_model 128, d_ff 256, 4 heads; a short schedule (600 steps, "
        "peak learning rate ~2.2e-3) that learns the embedded task in minutes",
        dict(**TINY_ARCHITECTURE, warmup_steps=200, learning_rate_scale=0.35, train_steps=600),
    ),
    "multi30k": (
        "Multi30k recipe for a 2-core CPU (docs/results.md): the tiny architecture (Wu et al. 2021's "
        "Transformer-Tiny), P_drop 0.2, peak learning rate ~3.1e-3 after 800 warmup steps, 3,000 steps",
        dict(
            **TINY_ARCHITECTURE,
            dropout=0.2,
            warmup_steps=800,
            learning_rate_scale=1.0,
            train_steps=3000,
        ),
    ),
    "small": (
        "CPU preset: 3+3 layers, d_model 256, d_ff 1024, 4 heads",
        dict(
            vocabulary_size=8000,
            num_encoder_layers=3,
            num_decoder_layers=3,
            hidden_dim=256,
            intermediate_dim=1024,
            num_heads=4,
            max_length=128,
            warmup_steps=2000,
            train_steps=10000,
        ),
    ),
}


def config_classes():
    """`TransformerConfig` and the configs of the models that extend the Transformer (its
    subclasses, e.g. `models.parsing.ParsingConfig`, defined when `keras_transformer.models`
    is imported), the Transformer's first."""
    classes = [TransformerConfig]
    for config_class in classes:
        classes.extend(config_class.__subclasses__())
    return classes


def config_fields():
    """The `dataclasses.Field`s of every config class (`config_classes`), each name once: the
    Transformer's, then those the other configs add (what `--flags` can override)."""
    fields = {}
    for config_class in config_classes():
        for field in dataclasses.fields(config_class):
            fields.setdefault(field.name, field)
    return list(fields.values())


def model_config(values):
    """The config a dict of fields describes (a run's `config.json` "model", a preset with its
    overrides): the first of `config_classes` that has every field in `values` that is not
    at its default.

    Raises:
        ValueError: a field no config has (`TransformerConfig.replace`'s message), or a bad value.
    """
    core = {field.name for field in dataclasses.fields(TransformerConfig)}
    added = {
        field.name: field.default
        for field in config_fields()
        if field.name not in core and field.default is not dataclasses.MISSING
    }
    # A field a model adds, at its default, adds nothing: such a config is the Transformer's
    # (a translation run written when the parsing fields were the Transformer's lists them so).
    values = {
        name: value for name, value in values.items() if name not in added or value != added[name]
    }
    for config_class in config_classes():
        if set(values) <= {field.name for field in dataclasses.fields(config_class)}:
            return config_class.from_dict(values)
    return TransformerConfig.from_dict(values)  # names the unknown fields


def register_preset(name, description, fields):
    """Add preset `name` to `PRESETS` (a model that extends the Transformer adds its recipes)."""
    if name in PRESETS:
        raise ValueError(f"Preset {name!r} is already defined")
    PRESETS[name] = (description, fields)


def get_preset(name, **overrides):
    """The config of preset `name`, with `overrides` applied (`model_config` chooses its class).

    Raises:
        ValueError: unknown preset (the message lists the valid names) or bad overrides.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}. Valid presets: {', '.join(PRESETS)}")
    return model_config({**PRESETS[name][1], **overrides})
