"""TransformerConfig, the preset table, and parameter counts (paper Table 3).

Run as a script (`python -m tests.test_config`) to print the preset table of
docs/architecture.md; `test_architecture_doc_table_is_current` fails when the doc differs.
"""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from keras_transformer import PRESETS, Transformer, TransformerConfig, get_preset
from keras_transformer.models import ParsingConfig, build_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
TABLE_START, TABLE_END = "<!-- preset-table:start -->", "<!-- preset-table:end -->"

# Table 3's "params x 10^6" column. Rows without a number (A, D, E) are implied equal to
# base (their changes do not alter the parameter count in the paper).
PAPER_PARAMS_MILLIONS = {
    "base": "65",
    "big": "213",
    "table3_b_dk16": "58",
    "table3_b_dk32": "60",
    "table3_c_n2": "36",
    "table3_c_n4": "50",
    "table3_c_n8": "80",
    "table3_c_d256": "28",
    "table3_c_d1024": "168",
    "table3_c_dff1024": "53",
    "table3_c_dff4096": "90",
}


def count_parameters(config):
    """Trainable parameters of `Transformer(config)`, from the config alone.

    Per attention: Q and K projections D x (h d_k) + biases, V projection D x (h d_v) + bias,
    output (h d_v) x D + bias. Per FFN: D x d_ff + d_ff + d_ff x D + D. Per LayerNorm: 2D.
    Encoder layers have 1 attention, 1 FFN, 2 norms; decoder layers 2, 1, 3. Plus the
    token embedding(s) V x D, learned positions 2 x max_length x D (row E), an untied
    output projection D x V + V, and pre-LN's two final norms.
    """
    d, f, h, v = (
        config.hidden_dim,
        config.intermediate_dim,
        config.num_heads,
        config.vocabulary_size,
    )
    dk, dv = config.head_key_dim, config.head_value_dim
    attention = 2 * (d * h * dk + h * dk) + (d * h * dv + h * dv) + (h * dv * d + d)
    feed_forward = (d * f + f) + (f * d + d)
    norm = 2 * d
    encoder = config.num_encoder_layers * (attention + feed_forward + 2 * norm)
    decoder = config.num_decoder_layers * (2 * attention + feed_forward + 3 * norm)
    embeddings = v * d * (1 if config.share_embeddings else 2)
    positions = 2 * config.max_length * d if config.positional == "learned" else 0
    output = 0 if config.tie_output else d * v + v
    final_norms = 2 * norm if config.normalize_first else 0
    return embeddings + positions + encoder + decoder + output + final_norms


def scaled_down(config):
    """The same architecture with every width / 16 and the vocabulary / 1000 (cheap to build)."""
    changes = dict(
        vocabulary_size=max(config.vocabulary_size // 1000, 8),
        hidden_dim=config.hidden_dim // 16,
        intermediate_dim=config.intermediate_dim // 16,
        max_length=config.max_length // 16,
    )
    for name in ("key_dim", "value_dim"):
        if getattr(config, name) is not None:
            changes[name] = max(getattr(config, name) // 16, 1)
    return config.replace(**changes)


def preset_table():
    """The markdown table of every preset with its parameter count beside the paper's."""
    lines = [
        "| preset | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls | positions | vocabulary | parameters | ≈ M | paper (M) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (_, _) in PRESETS.items():
        config = get_preset(name)
        count = count_parameters(config)
        layers = str(config.num_encoder_layers)
        if config.num_decoder_layers != config.num_encoder_layers:
            layers += f"+{config.num_decoder_layers}"
        if name in PAPER_PARAMS_MILLIONS:
            paper = PAPER_PARAMS_MILLIONS[name]
        elif name.startswith("table3_"):
            paper = "(65)"
        else:
            paper = "—"
        cells = [
            f"`{name}`",
            layers,
            str(config.hidden_dim),
            str(config.intermediate_dim),
            str(config.num_heads),
            str(config.head_key_dim),
            str(config.head_value_dim),
            str(config.dropout),
            str(config.label_smoothing),
            config.positional + (" + words" if getattr(config, "word_positions", False) else ""),
            f"{config.vocabulary_size:,}",
            f"{count:,}",
            f"{count / 1e6:.1f}",
            paper,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- parameter counts ---


def distinct_architectures():
    """The first preset of each distinct architecture (`config.architecture()`), in `PRESETS` order.

    Presets equal on every architecture field (e.g. the Table 3 (D) rows and base) build the
    same model, so one of each is built.
    """
    seen, names = set(), []
    for name in PRESETS:
        key = tuple(sorted(get_preset(name).architecture().items()))
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


@pytest.mark.parametrize("name", distinct_architectures())
def test_formula_matches_a_built_scaled_down_preset(name):
    config = scaled_down(get_preset(name))
    model = build_model(config)
    trainable = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    assert count_parameters(config) == trainable
    # The one non-trainable weight: a word-position model's table of piece kinds (V entries).
    assert model.count_params() - trainable == (
        config.vocabulary_size if getattr(config, "word_positions", False) else 0
    )


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(normalize_first=True),
        dict(positional="learned"),
        dict(tie_output=False),
        dict(share_embeddings=False),
        dict(share_embeddings=False, tie_output=False),
        dict(key_dim=3, value_dim=5),
        dict(num_encoder_layers=1, num_decoder_layers=3),
    ],
    ids=lambda changes: "-".join(f"{k}={v}" for k, v in changes.items()) or "default",
)
def test_formula_matches_built_tiny_variants(changes):
    config = get_preset(
        "tiny",
        vocabulary_size=29,
        num_encoder_layers=2,
        num_decoder_layers=2,
        hidden_dim=16,
        intermediate_dim=24,
        num_heads=2,
        max_length=12,
    ).replace(**changes)
    model = Transformer(config)
    assert count_parameters(config) == model.count_params()
    assert len(model.non_trainable_weights) == 0


def test_base_has_about_65_million_parameters():
    config = get_preset("base")
    count = Transformer(config).count_params()
    assert count == count_parameters(config)
    assert abs(count - 65e6) <= 0.05 * 65e6, count


def test_big_has_about_213_million_parameters():
    # Counted by the formula (checked above against built models, including a scaled-down
    # big and the full base); building big itself costs ~0.9 GB for no further check.
    count = count_parameters(get_preset("big"))
    assert abs(count - 213e6) <= 0.05 * 213e6, count


@pytest.mark.parametrize("name", list(PAPER_PARAMS_MILLIONS))
def test_counts_are_near_table3(name):
    paper = float(PAPER_PARAMS_MILLIONS[name]) * 1e6
    assert abs(count_parameters(get_preset(name)) - paper) <= 0.07 * paper


def test_architecture_doc_table_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert TABLE_START in text and TABLE_END in text
    documented = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert documented == preset_table(), (
        "docs/architecture.md is stale: paste `python -m tests.test_config`"
    )
    for name in PRESETS:
        assert len(re.findall(rf"^\| `{name}` \|", documented, flags=re.MULTILINE)) == 1, name


# --- the config ---


def test_base_preset_is_the_paper_base_model():
    config = get_preset("base")
    assert config == TransformerConfig()
    assert (config.num_encoder_layers, config.num_decoder_layers, config.hidden_dim) == (6, 6, 512)
    assert (
        config.intermediate_dim,
        config.num_heads,
        config.head_key_dim,
        config.head_value_dim,
    ) == (2048, 8, 64, 64)
    assert (config.dropout, config.label_smoothing, config.vocabulary_size) == (0.1, 0.1, 37000)
    assert (
        config.warmup_steps,
        config.beam_size,
        config.length_penalty,
        config.max_output_offset,
    ) == (4000, 4, 0.6, 50)
    assert config.average_checkpoints == 5
    assert not config.normalize_first and config.positional == "sinusoidal"
    assert config.share_embeddings and config.tie_output


def test_big_preset():
    config = get_preset("big")
    assert (config.hidden_dim, config.intermediate_dim, config.num_heads, config.dropout) == (
        1024,
        4096,
        16,
        0.3,
    )
    assert config.head_key_dim == 64 and config.average_checkpoints == 20


def test_table3_rows_change_only_their_fields():
    base = get_preset("base")
    for name, (description, changes) in PRESETS.items():
        if not name.startswith("table3_"):
            continue
        config = get_preset(name)
        differing = {
            field for field in base.to_dict() if getattr(config, field) != getattr(base, field)
        }
        assert differing == set(changes), name
        assert description.startswith("Table 3 (")
    # Rows (A) keep h * d_k = d_model (constant computation).
    for heads, depth in [(1, 512), (4, 128), (16, 32), (32, 16)]:
        config = get_preset(f"table3_a_h{heads}")
        assert (config.num_heads, config.head_key_dim, config.head_value_dim) == (
            heads,
            depth,
            depth,
        )
    assert (
        get_preset("table3_b_dk16").head_key_dim,
        get_preset("table3_b_dk16").head_value_dim,
    ) == (16, 64)
    assert get_preset("table3_c_d256").head_key_dim == 32
    assert get_preset("table3_c_d1024").head_key_dim == 128


def test_config_is_frozen_and_replace_validates():
    config = get_preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_dim = 64
    changed = config.replace(dropout=0.2)
    assert changed.dropout == 0.2 and config.dropout == 0.1
    with pytest.raises(ValueError, match="dropout=1.5"):
        config.replace(dropout=1.5)


def test_dict_round_trip_through_json():
    config = get_preset("table3_e_learned", vocabulary_size=1234)
    assert TransformerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_overrides_apply_on_top_of_the_preset():
    config = get_preset("small", vocabulary_size=500, normalize_first=True)
    assert (config.vocabulary_size, config.normalize_first, config.hidden_dim) == (500, True, 256)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="num_heads=7") as error:
        TransformerConfig(num_heads=7)
    assert "512" in str(error.value)
    # With an explicit key_dim the heads need not divide d_model.
    assert TransformerConfig(num_heads=7, key_dim=64).head_key_dim == 64


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocabulary_size", 0),
        ("num_encoder_layers", 0),
        ("num_decoder_layers", -2),
        ("hidden_dim", -512),
        ("intermediate_dim", 0),
        ("num_heads", 0),
        ("key_dim", 0),
        ("target_vocabulary_size", 0),
        ("max_length", 0),
        ("warmup_steps", 0),
        ("beam_size", 0),
        ("hidden_dim", 512.0),
        ("num_heads", True),
    ],
)
def test_non_positive_or_non_integer_sizes_raise(field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        TransformerConfig(**{field: value})


@pytest.mark.parametrize(
    "field", ["dropout", "attention_dropout", "activation_dropout", "label_smoothing"]
)
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_rates_outside_zero_one_raise(field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        TransformerConfig(**{field: value})


def test_other_bad_values_raise():
    with pytest.raises(ValueError, match="positional='rotary'"):
        TransformerConfig(positional="rotary")
    with pytest.raises(ValueError, match="layer_norm_epsilon=0"):
        TransformerConfig(layer_norm_epsilon=0)
    with pytest.raises(ValueError, match="length_penalty=-1"):
        TransformerConfig(length_penalty=-1)
    with pytest.raises(ValueError, match="max_output_offset=-5"):
        TransformerConfig(max_output_offset=-5)
    with pytest.raises(ValueError, match="tokenizer_type='wordpiece'"):
        TransformerConfig(tokenizer_type="wordpiece")
    with pytest.raises(ValueError, match="sinusoid_layout='halves'"):
        TransformerConfig(sinusoid_layout="halves")
    with pytest.raises(ValueError, match="sinusoid_layout='concatenated', positional='learned'"):
        TransformerConfig(sinusoid_layout="concatenated", positional="learned")
    with pytest.raises(ValueError, match="activation='swishy'"):
        TransformerConfig(activation="swishy")
    with pytest.raises(ValueError, match="final_logits_bias='yes'"):
        TransformerConfig(final_logits_bias="yes")
    with pytest.raises(
        ValueError, match="needs share_embeddings=False.*target_vocabulary_size=90.*=100"
    ):
        TransformerConfig(vocabulary_size=100, target_vocabulary_size=90)
    with pytest.raises(
        ValueError, match="word_positions needs sinusoidal positions .* positional='learned'"
    ):
        ParsingConfig(word_positions=True, positional="learned")
    with pytest.raises(ValueError, match="hidden_dim divisible by 4.* hidden_dim=510"):
        ParsingConfig(word_positions=True, hidden_dim=510, num_heads=5)
    with pytest.raises(
        ValueError, match="word_window needs word_positions=True. Received: word_window=1"
    ):
        ParsingConfig(word_window=1)
    with pytest.raises(ValueError, match="word_window=-1"):
        ParsingConfig(word_positions=True, word_window=-1)


def test_marian_options_default_to_the_paper():
    """The options an OPUS-MT (Marian) model needs: at their defaults, the paper's model, so a
    run's config.json written before them reads as before; each is an architecture field."""
    config = TransformerConfig()
    assert (config.sinusoid_layout, config.activation) == ("interleaved", "relu")
    assert not config.final_logits_bias and config.target_vocabulary_size is None
    assert config.decoder_vocabulary_size == config.vocabulary_size
    separate = config.replace(share_embeddings=False, target_vocabulary_size=900)
    assert (separate.vocabulary_size, separate.decoder_vocabulary_size) == (37000, 900)
    for name in ("sinusoid_layout", "final_logits_bias", "target_vocabulary_size"):
        assert name in config.architecture()
    assert config.replace(activation="silu").activation == "silu"


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'huge'") as error:
        get_preset("huge")
    for name in PRESETS:
        assert name in str(error.value)


def test_unknown_fields_raise():
    with pytest.raises(ValueError, match="d_model") as error:
        get_preset("base", d_model=256)
    assert "hidden_dim" in str(error.value)  # the message lists the valid fields
    with pytest.raises(ValueError, match="num_layers"):
        get_preset("tiny").replace(num_layers=2)
    with pytest.raises(ValueError, match="heads"):
        TransformerConfig.from_dict({"heads": 4})


def test_counts_grow_as_table3_says():
    counts = {name: count_parameters(get_preset(name)) for name in PRESETS}
    assert counts["table3_c_n2"] < counts["table3_c_n4"] < counts["base"] < counts["table3_c_n8"]
    assert counts["table3_c_d256"] < counts["base"] < counts["table3_c_d1024"]
    assert counts["table3_b_dk16"] < counts["table3_b_dk32"] < counts["base"]
    for name in (
        "table3_a_h1",
        "table3_a_h4",
        "table3_a_h16",
        "table3_a_h32",
        "table3_d_drop0",
        "table3_d_ls02",
    ):
        assert counts[name] == counts["base"], name
    assert counts["table3_e_learned"] - counts["base"] == 2 * 256 * 512
    assert np.isclose(counts["big"] / 1e6, 213, rtol=0.05)


def test_a_corpus_preset_keeps_its_vocabulary_size():
    from keras_transformer import cli

    assert cli.corpus_defaults("small", "multi30k") == {"vocabulary_size": 8000}
    assert cli.corpus_defaults("multi30k", "multi30k") == {}
    assert cli.corpus_defaults("tiny", "wmt14") == {"vocabulary_size": 37000}


if __name__ == "__main__":
    print(TABLE_START)
    print(preset_table())
    print(TABLE_END)
