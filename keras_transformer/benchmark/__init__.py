"""Measurements behind `experiments/benchmark*.py`: timing, FLOPs, hardware peaks, peers built the same size,
decoding speed, and the table and plot of the results."""

from keras_transformer.benchmark.flops import matmul_flops_per_second, training_flops
from keras_transformer.benchmark.peaks import (
    GPU_PEAKS,
    Peak,
    cpu_peak,
    cpu_peak_flops,
    gpu_peak,
    hardware_peak,
)
from keras_transformer.benchmark.peers import keras_hub_transformer
from keras_transformer.benchmark.report import format_table, plot_ratios
from keras_transformer.benchmark.timing import (
    compare_steps,
    fastest_of_alternating,
    make_train_step,
    run_steps,
    warm_up,
)
from keras_transformer.lazy import lazy_attributes

# The parts that need TensorFlow (its data pipeline, the exported search) import when first
# asked for: the rest runs on every backend (`benchmark.accelerator` on JAX or PyTorch).
__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(("padded_batches", "real_lengths"), "keras_transformer.benchmark.batches"),
        **dict.fromkeys(
            ("DecodingSpeed", "benchmark_decoding", "format_speed_table"),
            "keras_transformer.benchmark.decoding",
        ),
        **dict.fromkeys(
            ("Row", "ctranslate2_rows", "decoding_rows", "training_rows"),
            "keras_transformer.benchmark.rows",
        ),
    },
)

__all__ = [
    "GPU_PEAKS",
    "DecodingSpeed",
    "Peak",
    "Row",
    "benchmark_decoding",
    "compare_steps",
    "cpu_peak",
    "cpu_peak_flops",
    "ctranslate2_rows",
    "decoding_rows",
    "fastest_of_alternating",
    "format_speed_table",
    "format_table",
    "gpu_peak",
    "hardware_peak",
    "keras_hub_transformer",
    "make_train_step",
    "matmul_flops_per_second",
    "padded_batches",
    "plot_ratios",
    "real_lengths",
    "run_steps",
    "training_flops",
    "training_rows",
    "warm_up",
]
