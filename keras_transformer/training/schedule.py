"""The paper's learning-rate schedule (section 5.3)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (paper eq. 3).

    Linear warmup for `warmup_steps`, then decay with the inverse square root of the step.
    `step` counts updates from 1: the optimizer's iteration counter (which starts at 0) is
    shifted by one, so the very first update already has a non-zero rate.

    Args:
        hidden_dim: d_model.
        warmup_steps: 4000 in the paper.
        scale: a constant multiplier (1.0 in the paper).

    Example:

    >>> schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 8)  # the peak, at step 4000
    0.00069877
    """

    def __init__(self, hidden_dim, warmup_steps=4000, scale=1.0):
        if hidden_dim <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(
                "hidden_dim, warmup_steps and scale must be positive. "
                f"Received: hidden_dim={hidden_dim}, warmup_steps={warmup_steps}, scale={scale}"
            )
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        rate = ops.minimum(ops.rsqrt(step), step * warmup**-1.5)
        return self.scale * self.hidden_dim**-0.5 * rate

    def get_config(self):
        return {"hidden_dim": self.hidden_dim, "warmup_steps": self.warmup_steps, "scale": self.scale}


def paper_optimizer(hidden_dim, warmup_steps=4000, scale=1.0, precision="float32"):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) with `TransformerSchedule` (section 5.3).

    Under `mixed_float16` the optimizer is wrapped in a `LossScaleOptimizer`.
    """
    optimizer = keras.optimizers.Adam(
        learning_rate=TransformerSchedule(hidden_dim, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
    )
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
