"""Decoding speed helpers: they live in `keras_transformer.benchmark.decoding`, imported here
so that `keras_transformer.evaluation` keeps exporting them."""

from keras_transformer.benchmark.decoding import (  # noqa: F401
    DecodingSpeed,
    agreement,
    benchmark_decoding,
    format_speed_table,
    source_batches,
    time_search,
)
