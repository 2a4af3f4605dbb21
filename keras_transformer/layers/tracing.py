"""Whether the code being traced will be compiled by XLA (and so needs static shapes).

Cached decoding picks its shapes with this: outside XLA, attention reads only the written
prefix of the key/value buffer (a shape that changes every step, which TensorFlow graphs
allow for tensors that are not loop variables); under XLA every shape must be static, so
it reads the whole buffer and relies on the causal mask.

TensorFlow is imported only when it is the Keras backend: on JAX and PyTorch the layers
run without it.
"""

import keras


def in_xla_context():
    """True while tracing inside `tf.function(jit_compile=True)` (or another XLA context).

    Always False eagerly and with a backend other than TensorFlow.
    """
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util  # TensorFlow internals: is this graph compiled by XLA?

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
