"""Measurements behind `experiments/benchmark.py`: throughput, FLOPs, hardware peaks, peers built the same size."""

from keras_transformer.benchmark.flops import matmul_flops_per_second, training_flops
from keras_transformer.benchmark.peaks import GPU_PEAKS, Peak, cpu_peak, cpu_peak_flops, gpu_peak, hardware_peak
from keras_transformer.benchmark.peers import keras_hub_transformer
from keras_transformer.benchmark.timing import compare_steps, make_train_step, time_steps

__all__ = [
    "GPU_PEAKS",
    "Peak",
    "compare_steps",
    "cpu_peak",
    "cpu_peak_flops",
    "gpu_peak",
    "hardware_peak",
    "keras_hub_transformer",
    "make_train_step",
    "matmul_flops_per_second",
    "time_steps",
    "training_flops",
]
