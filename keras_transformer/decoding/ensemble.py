"""Ensemble decoding: several trained models search as one.

At every step each model computes its next-token distribution on the same prefix, and the
search sees their mean, `log((p_1 + ... + p_M) / M)` (Vinyals et al. 2015 ensemble their
parsers this way; so does fairseq). Every search (greedy, beam, sampling) and every
constraint works unchanged: `EnsembleStep` has the step interface of `decoding.steps`, and
its state holds each model's own state (its cache, its source mask).

The models must share the target vocabulary (one tokenizer): `Ensemble` checks their
vocabulary sizes; `runs.load_ensemble` also checks that the runs' tokenizers are the same
file.
"""

import math

from keras import ops

from keras_transformer.decoding.steps import CachedStep, RecomputeStep


class EnsembleStep:
    """The step of several models (see `decoding.steps` for the interface).

    Args:
        steps: one step object per model (`CachedStep`, `RecomputeStep`, ...).
        model: what the searches read the output length limit from (`model.config`), e.g.
            the `Ensemble`.

    `step` returns `log(mean_m softmax(logits_m))`: log-probabilities, which a search's
    log-softmax leaves as they are.
    """

    def __init__(self, steps, model=None):
        self.steps = tuple(steps)
        self.model = model
        if not self.steps:
            raise ValueError("An ensemble needs at least one model")
        self.can_drop_sentences = all(
            getattr(step, "can_drop_sentences", False) for step in self.steps
        )

    def initialize(self, source_ids, buffer_size, num_copies=1):
        return tuple(step.initialize(source_ids, buffer_size, num_copies) for step in self.steps)

    def step(self, state, target_ids, index):
        log_probs, states = [], []
        for step, member in zip(self.steps, state):
            logits, member = step.step(member, target_ids, index)
            log_probs.append(ops.log_softmax(logits, axis=-1))
            states.append(member)
        mean = ops.logsumexp(ops.stack(log_probs), axis=0) - math.log(len(log_probs))
        return mean, tuple(states)

    def reorder(self, state, indices, sentences=None):
        extra = () if sentences is None else (sentences,)
        return tuple(
            step.reorder(member, indices, *extra) for step, member in zip(self.steps, state)
        )


class Ensemble:
    """Trained models that translate or parse as one (`Translator`, `Parser`, the searches).

    Args:
        models: `Transformer`s with the same vocabulary (e.g. from `runs.load_ensemble`),
            and with learned positions the same `max_length`. The first one's `config` is
            the ensemble's.

    Example:

    >>> import numpy as np
    >>> from keras_transformer import Transformer, get_preset
    >>> from keras_transformer.decoding import Ensemble, beam_search
    >>> config = get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
    ...                     num_decoder_layers=1, hidden_dim=32, num_heads=2)
    >>> models = [Transformer(config) for _ in range(2)]
    >>> ids, scores = beam_search(Ensemble(models), np.array([[5, 6, 7, 3]]), beam_size=4,
    ...                           max_length=8)
    >>> tuple(ids.shape), tuple(scores.shape)
    ((1, 1, 8), (1, 1))
    """

    def __init__(self, models):
        self.models = tuple(models)
        if not self.models:
            raise ValueError("An ensemble needs at least one model")
        sizes = [
            (model.config.vocabulary_size, model.config.decoder_vocabulary_size)
            for model in self.models
        ]
        if len(set(sizes)) > 1:
            raise ValueError(
                "The models of an ensemble share one vocabulary; their (source, target) "
                f"vocabulary sizes: {sizes}"
            )
        positions = {(model.config.positional, model.config.max_length) for model in self.models}
        if len(positions) > 1 and any(positional == "learned" for positional, _ in positions):
            raise ValueError(
                "The models of an ensemble with learned positions share one max_length and positional; "
                f"theirs: {sorted(positions)}"
            )

    @property
    def config(self):
        return self.models[0].config

    def make_step(self, use_cache=True, prefix_only=None):
        """An `EnsembleStep` of the models' `CachedStep`s (or `RecomputeStep`s)."""
        return EnsembleStep(
            [
                CachedStep(model) if use_cache else RecomputeStep(model, prefix_only)
                for model in self.models
            ],
            model=self,
        )
