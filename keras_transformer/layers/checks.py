"""Argument validation shared by the layers and the model config."""

import numbers


def check_positive_int(name, value):
    """Raise `ValueError` naming `name` unless `value` is a positive int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")


def check_rate(name, value):
    """Raise `ValueError` naming `name` unless `0 <= value < 1`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1). Received: {name}={value!r}")


def check_non_negative_int(name, value):
    """Raise `ValueError` naming `name` unless `value` is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0. Received: {name}={value!r}")


def check_non_negative_number(name, value):
    """Raise `ValueError` naming `name` unless `value` is a real number >= 0 (NaN is refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0. Received: {name}={value!r}")
