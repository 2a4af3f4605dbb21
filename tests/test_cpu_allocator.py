"""TensorFlow's pooled CPU allocator: on in the scripts, off when the environment says so (real processes)."""

import subprocess
import sys

from keras_transformer.cpu_allocator import ENVIRONMENT_VARIABLE
from tests.scripts import script_environment

# What a script does: select the allocator first, run TensorFlow, then report which one the CPU device has.
PROGRAM = """
from keras_transformer import cpu_allocator
cpu_allocator.use_pooled_cpu_allocator()
import tensorflow as tf
tf.reduce_sum(tf.ones((256, 256)))
print(cpu_allocator.describe())
"""


def described(setting, **environment):
    """What `PROGRAM` reports with `TF_CPU_ALLOCATOR_USE_BFC` set to `setting` (None: unset)."""
    env = script_environment(**environment)
    env.pop(ENVIRONMENT_VARIABLE, None)
    if setting is not None:
        env[ENVIRONMENT_VARIABLE] = setting
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_pooled_unless_the_environment_says_otherwise():
    # Where TensorFlow turns its oneDNN ops on by default (CPUs with AVX512_VNNI, AVX512_BF16 or
    # AMX), the CPU device takes oneDNN's allocator, which pools whatever the variable says; with
    # them off, on every CPU, the variable alone decides.
    assert described(None, TF_ENABLE_ONEDNN_OPTS="0") == "pooled (TF_CPU_ALLOCATOR_USE_BFC=true)"
    assert (
        described("false", TF_ENABLE_ONEDNN_OPTS="0") == "malloc (TF_CPU_ALLOCATOR_USE_BFC=false)"
    )
