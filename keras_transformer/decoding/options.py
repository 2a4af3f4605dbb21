"""`SearchOptions`: the one home of the search settings (method, beam size, α, offset, sampling).

A run's config holds the paper's settings (`beam_size`, `length_penalty`,
`max_output_offset`); `SearchOptions.from_config` starts from them and applies explicit
overrides (absl flags left unset are `None` and keep the config's value). Translation,
evaluation, checkpoint scoring and export all build their settings this way.
"""

import dataclasses
import numbers

from keras_transformer.layers.checks import (
    check_non_negative_int,
    check_non_negative_number,
    check_positive_int,
)

METHODS = ("greedy", "beam", "sample")

SEARCH_OPTIONS = {
    "greedy": ("max_output_offset", "max_length"),
    "beam": ("beam_size", "length_penalty", "max_output_offset", "max_length", "num_return"),
    "sample": ("temperature", "top_k", "top_p", "seed", "max_output_offset", "max_length"),
}
"""The keyword arguments each method's search function takes (besides the model and sources)."""

# Settings whose None means "the search function's default" (they are left out of `kwargs`).
_OPTIONAL = ("max_length", "num_return", "temperature", "top_k", "top_p", "seed")


def check_method(method):
    """Raise `ValueError` unless `method` is one of `METHODS`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}. Received: method={method!r}")


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Search settings, checked when built.

    Attributes:
        method: "greedy", "beam" or "sample".
        beam_size: K (paper: 4); beam only.
        length_penalty: α of lp(Y) = ((5 + |Y|) / 6)^α (paper: 0.6); beam only.
        max_output_offset: at most source length + this many output tokens (paper: 50).
        max_length: the static output buffer length L, or None (source length + offset).
        num_return: hypotheses per sentence, in [1, beam_size]; beam only (None: 1).
        temperature, top_k, top_p, seed: sampling only (None: `sample`'s defaults 1.0, 0, 1.0,
            no seed).

    Example:

    >>> from keras_transformer import get_preset
    >>> options = SearchOptions.from_config(get_preset("base"), "beam", beam_size=8, length_penalty=None)
    >>> options.beam_size, options.length_penalty, options.max_output_offset
    (8, 0.6, 50)
    >>> options.kwargs()
    {'beam_size': 8, 'length_penalty': 0.6, 'max_output_offset': 50}
    """

    method: str = "beam"
    beam_size: int = 4
    length_penalty: float = 0.6
    max_output_offset: int = 50
    max_length: int = None
    num_return: int = None
    temperature: float = None
    top_k: int = None
    top_p: float = None
    seed: int = None

    def __post_init__(self):
        check_method(self.method)
        check_positive_int("beam_size", self.beam_size)
        check_non_negative_number("length_penalty", self.length_penalty)
        check_non_negative_int("max_output_offset", self.max_output_offset)
        if self.max_length is not None:
            check_positive_int("max_length", self.max_length)
        if self.num_return is not None:
            check_positive_int("num_return", self.num_return)
            if self.num_return > self.beam_size:
                raise ValueError(
                    f"num_return must be in [1, beam_size]. Received: num_return={self.num_return}, "
                    f"beam_size={self.beam_size}"
                )
        if self.temperature is not None and (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, numbers.Real)
            or not self.temperature > 0
        ):
            raise ValueError(
                f"temperature must be a number > 0. Received: temperature={self.temperature!r}"
            )
        if self.top_k is not None:
            check_non_negative_int("top_k", self.top_k)
        if self.top_p is not None and (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, numbers.Real)
            or not 0 < self.top_p <= 1
        ):
            raise ValueError(f"top_p must be in (0, 1]. Received: top_p={self.top_p!r}")
        given = [name for name in _OPTIONAL if getattr(self, name) is not None]
        _check_applicable(self.method, given)

    @classmethod
    def from_config(cls, config, method="beam", **overrides):
        """The config's settings (`beam_size`, `length_penalty`, `max_output_offset`) for
        `method`, with the `overrides` that are not None.

        Raises:
            ValueError: for an unknown method, an override the method does not take, or
                an invalid value (named).
        """
        check_method(method)
        given = {name: value for name, value in overrides.items() if value is not None}
        known = {field.name for field in dataclasses.fields(cls)} - {"method"}
        if set(given) - known:
            raise ValueError(
                f"Unknown search options {sorted(set(given) - known)}; known: {sorted(known)}"
            )
        _check_applicable(method, given)
        settings = {
            "beam_size": config.beam_size,
            "length_penalty": float(config.length_penalty),
            "max_output_offset": config.max_output_offset,
        }
        return cls(method=method, **{**settings, **given})

    def with_method(self, method):
        """These settings for another method: the same beam size, α and offset, and the
        optional settings `method` does not take dropped.

        Example:

        >>> beam = SearchOptions(beam_size=6, num_return=2, max_length=20)
        >>> beam.with_method("greedy").kwargs()
        {'max_output_offset': 50, 'max_length': 20}
        """
        check_method(method)
        dropped = {name: None for name in _OPTIONAL if name not in SEARCH_OPTIONS[method]}
        return dataclasses.replace(self, method=method, **dropped)

    def kwargs(self):
        """The keyword arguments of this method's search function (`make_search_fn(model, method, **kwargs)`)."""
        names = SEARCH_OPTIONS[self.method]
        return {
            name: getattr(self, name)
            for name in ("beam_size", "length_penalty", "max_output_offset", *_OPTIONAL)
            if name in names and not (name in _OPTIONAL and getattr(self, name) is None)
        }


def _check_applicable(method, names):
    invalid = sorted(set(names) - set(SEARCH_OPTIONS[method]))
    if invalid:
        raise ValueError(
            f"{', '.join(invalid)} {'does' if len(invalid) == 1 else 'do'} not apply to method={method!r}; "
            f"it takes {', '.join(SEARCH_OPTIONS[method])}"
        )
