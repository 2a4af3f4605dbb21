"""Measurements behind `experiments/benchmark.py`: throughput, FLOPs, peers built the same size."""

from keras_transformer.benchmark.flops import matmul_flops_per_second, training_flops
from keras_transformer.benchmark.peers import keras_hub_transformer
from keras_transformer.benchmark.timing import compare_steps, make_train_step, time_steps

__all__ = [
    "compare_steps",
    "keras_hub_transformer", "make_train_step", "matmul_flops_per_second", "time_steps", "training_flops"]
