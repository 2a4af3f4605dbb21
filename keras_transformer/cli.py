"""absl flag helpers shared by the scripts in `experiments/`.

`define_config_flags()` defines `--preset` and one flag per `TransformerConfig` field
(`--hidden_dim`, `--num_heads`, `--dropout`, ...), each defaulting to the preset's value.
"""

import dataclasses
import typing

from absl import flags

from keras_transformer.models.config import PRESETS, TransformerConfig, get_preset


def define_config_flags(default_preset="tiny"):
    """Define `--preset` and an override flag for every config field."""
    flags.DEFINE_enum("preset", default_preset, list(PRESETS), "Model preset; other config flags override it.")
    for field in dataclasses.fields(TransformerConfig):
        kind = _field_kind(field)
        help_text = f"Override the preset's {field.name}."
        if kind is bool:
            flags.DEFINE_bool(field.name, None, help_text)
        elif kind is int:
            flags.DEFINE_integer(field.name, None, help_text)
        elif kind is float:
            flags.DEFINE_float(field.name, None, help_text)
        else:
            flags.DEFINE_string(field.name, None, help_text)


def config_from_flags(flag_values=flags.FLAGS, **defaults):
    """The preset named by `--preset` with `defaults`, then every flag given, applied."""
    overrides = dict(defaults)
    for field in dataclasses.fields(TransformerConfig):
        value = flag_values[field.name].value
        if value is not None:
            overrides[field.name] = value
    return get_preset(flag_values.preset, **overrides)


def _field_kind(field):
    kind = field.type
    if isinstance(kind, str):
        kind = eval(kind, vars(typing))  # annotations as strings
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind
