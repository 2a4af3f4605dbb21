"""The paper's learning-rate schedule (section 5.3), and two fixed-budget decays."""

import math

import keras
from keras import ops

from keras_transformer.models.config import check_learning_rate_decay


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (paper eq. 3).

    Linear warmup for `warmup_steps`, then decay with the inverse square root of the step.
    `step` counts updates from 1: the optimizer's iteration counter (which starts at 0) is
    shifted by one, so the very first update already has a non-zero rate.

    With `decay="linear"` or `"cosine"` the same warmup reaches the same peak
    (`scale * d_model^-0.5 * warmup_steps^-0.5`), which then falls linearly or along a
    half cosine to 0 at `train_steps` (and stays 0 after it), so a run with a fixed budget
    of steps ends at a rate of 0 instead of on the paper's slow inverse-square-root tail.

    Args:
        hidden_dim: d_model.
        warmup_steps: 4000 in the paper.
        scale: a constant multiplier (1.0 in the paper).
        decay: "rsqrt" (the paper), "linear" or "cosine".
        train_steps: the step where "linear" and "cosine" reach 0 (> warmup_steps).

    Example:

    >>> schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 8)  # the peak, at step 4000
    0.00069877
    """

    def __init__(self, hidden_dim, warmup_steps=4000, scale=1.0, decay="rsqrt", train_steps=None):
        if hidden_dim <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(
                "hidden_dim, warmup_steps and scale must be positive. "
                f"Received: hidden_dim={hidden_dim}, warmup_steps={warmup_steps}, scale={scale}"
            )
        check_learning_rate_decay(decay, warmup_steps, train_steps, name="decay")
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.decay = decay
        self.train_steps = train_steps

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = float(self.warmup_steps)
        if self.decay == "rsqrt":
            rate = ops.minimum(ops.rsqrt(step), step * warmup**-1.5)
        else:
            # Fraction of the decay phase done: 0 at the peak, 1 at train_steps.
            done = ops.clip((step - warmup) / (float(self.train_steps) - warmup), 0.0, 1.0)
            if self.decay == "linear":
                remaining = 1.0 - done
            else:
                remaining = 0.5 * (1.0 + ops.cos(math.pi * done))
            rate = ops.minimum(step / warmup, remaining) * warmup**-0.5
        return self.scale * self.hidden_dim**-0.5 * rate

    def get_config(self):
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "decay": self.decay,
            "train_steps": self.train_steps,
        }


def paper_optimizer(
    hidden_dim, warmup_steps=4000, scale=1.0, precision="float32", decay="rsqrt", train_steps=None
):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) with `TransformerSchedule` (section 5.3).

    Under `mixed_float16` the optimizer is wrapped in a `LossScaleOptimizer`.
    """
    optimizer = keras.optimizers.Adam(
        learning_rate=TransformerSchedule(hidden_dim, warmup_steps, scale, decay, train_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
    )
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
