"""Whether the code being traced will be compiled by XLA (and so needs static shapes), and
where a custom gradient's ops are named.

Cached decoding picks its shapes with this: outside XLA, attention reads only the written
prefix of the key/value buffer (a shape that changes every step, which TensorFlow graphs
allow for tensors that are not loop variables); under XLA every shape must be static, so
it reads the whole buffer and relies on the causal mask.

TensorFlow is imported only when it is the Keras backend: on JAX and PyTorch the layers
run without it.
"""

import contextlib

import keras


def in_xla_context():
    """True while tracing inside `tf.function(jit_compile=True)` (or another XLA context).

    Always False eagerly and with a backend other than TensorFlow.
    """
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import (
        control_flow_util,
    )  # TensorFlow internals: is this graph compiled by XLA?

    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def needs_static_shapes(value=None):
    """True when shapes must be static: TensorFlow under XLA (`in_xla_context`), or `value`
    traced by JAX (inside `jax.jit` or a `lax` loop, e.g. `ops.while_loop`). PyTorch runs
    eagerly: False.
    """
    if keras.backend.backend() == "jax":
        import jax

        return isinstance(value, jax.core.Tracer)
    return in_xla_context()


def gradient_scope():
    """Called in the forward pass of a `custom_gradient` function: a function that makes a
    context manager for its gradient, which names the gradient's ops `<the forward pass's scope>/gradient/...`.

    TensorFlow names a custom gradient's ops after the scope `tape.gradient` runs in, outside
    the layer, so the profiler counted a layer's backward pass as the loss's
    (`benchmark.profile.TRAINING_PARTS` reads the layer's name in the op names). Elsewhere it
    does nothing.
    """
    if keras.backend.backend() != "tensorflow":
        return contextlib.nullcontext
    import tensorflow as tf

    scope = tf.get_current_name_scope()
    return lambda: tf.name_scope(
        f"{scope}/gradient/" if scope else "gradient/"
    )  # a trailing "/": absolute
