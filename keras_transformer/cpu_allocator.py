"""TensorFlow's pooled CPU allocator, which the scripts in `experiments/` turn on.

By default TensorFlow's CPU device takes every tensor from the C library's `malloc`, which gives
blocks above its mmap threshold back to the system when they are freed. The next tensor of that
size then pays one page fault per page on first touch, which costs more than a pass over memory
already mapped. A training step frees and takes back such tensors (the logits) every
step. TensorFlow's BFC allocator keeps freed blocks in a pool instead;
`TF_CPU_ALLOCATOR_USE_BFC=true` selects it (what it gains per training step: docs/results-log.md,
"The pooled CPU allocator, and rows a–c again"). Pooled memory is kept for the process's life,
so its resident size stays at the step's peak.

TensorFlow reads the variable once, when it creates its CPU device (at its first op), so it must be
set before that; importing TensorFlow is not too early. A user's own choice of the variable is
kept: `TF_CPU_ALLOCATOR_USE_BFC=false` selects `malloc` again. On CPUs where TensorFlow turns its
oneDNN ops on by default (those with AVX512_VNNI, AVX512_BF16 or AMX), the CPU device takes
oneDNN's allocator, which pools too, whatever the variable says (`TF_ENABLE_ONEDNN_OPTS=0` turns
that off); `describe()` reports what the device has.
"""

import os

ENVIRONMENT_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


def use_pooled_cpu_allocator():
    """Select TensorFlow's pooled CPU allocator unless the environment already chose one.

    Takes effect only when called before TensorFlow runs its first op; `describe()` says which
    allocator the CPU device has.
    """
    os.environ.setdefault(ENVIRONMENT_VARIABLE, "true")


def pooled():
    """Whether TensorFlow's CPU device pools its memory (creates the device if it does not exist yet).

    Only the pooled allocator keeps the statistics `tf.config.experimental.get_memory_info` reads.
    """
    import tensorflow as tf

    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:
        return False
    return True


def describe():
    """One phrase for logs and benchmark reports, e.g. "pooled (TF_CPU_ALLOCATOR_USE_BFC=true)"."""
    setting = f"{ENVIRONMENT_VARIABLE}={os.environ.get(ENVIRONMENT_VARIABLE, 'unset')}"
    return f"{'pooled' if pooled() else 'malloc'} ({setting})"
