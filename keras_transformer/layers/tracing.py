"""Whether the TensorFlow code being traced will be compiled by XLA.

Cached decoding picks its shapes with this: outside XLA, attention reads only the written
prefix of the key/value buffer (a shape that changes every step, which TensorFlow graphs
allow for tensors that are not loop variables); under XLA every shape must be static, so
it reads the whole buffer and relies on the causal mask.
"""

import keras

try:  # TensorFlow internals that tell whether the current graph is compiled by XLA.
    import tensorflow as _tf
    from tensorflow.python.ops import control_flow_util as _control_flow_util
except ImportError:  # pragma: no cover
    _tf = _control_flow_util = None


def in_xla_context():
    """True while tracing inside `tf.function(jit_compile=True)` (or another XLA context).

    Always False eagerly and with a backend other than TensorFlow.
    """
    if _control_flow_util is None or keras.backend.backend() != "tensorflow" or _tf.executing_eagerly():
        return False
    return bool(_control_flow_util.GraphOrParentsInXlaContext(_tf.compat.v1.get_default_graph()))
