"""Search algorithms over the cached decoder step: greedy, beam (GNMT length penalty), sampling.

Every search is one loop over a step function, written in `keras.ops`. On TensorFlow the
loop is a `tf.while_loop` (static shapes under XLA), so it runs eagerly, under
`tf.function`, under XLA (`jit_compile=True`) and inside exported SavedModels; greedy and
beam search run the same code on JAX (`lax.while_loop`, under `jax.jit`) and PyTorch.
`CachedStep` uses the model's key/value cache (growing with the output on TensorFlow
outside XLA, preallocated elsewhere); `RecomputeStep` re-runs the full decoder every step
(the baseline, `use_cache=False`, TensorFlow only).

Example:

>>> from keras_transformer import Transformer, get_preset
>>> from keras_transformer.decoding import beam_search, greedy_search
>>> model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
...                                num_decoder_layers=1, hidden_dim=32, num_heads=2))
>>> token_ids, scores = greedy_search(model, [[5, 6, 7, 3]], max_length=8)
>>> token_ids, scores = beam_search(model, [[5, 6, 7, 3]], beam_size=4, max_length=8)
"""

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.decoding.beam import beam_search, recompute_beam_search
from keras_transformer.decoding.ensemble import Ensemble, EnsembleStep
from keras_transformer.decoding.greedy import (
    filter_logits,
    greedy_search,
    recompute_greedy_search,
    sample,
)
from keras_transformer.decoding.lengths import length_penalty
from keras_transformer.decoding.options import METHODS, SEARCH_OPTIONS, SearchOptions
from keras_transformer.decoding.parser import Parser
from keras_transformer.decoding.searcher import best_hypotheses, make_search_fn
from keras_transformer.decoding.steps import CachedStep, RecomputeStep, make_step
from keras_transformer.decoding.translator import (
    SavedModelTranslator,
    Translator,
    decode_lines,
    translate_in_batches,
    translate_lines,
)
from keras_transformer.decoding.tree_constraint import TreeConstraint
from keras_transformer.model_root import resolve_saved_model

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "METHODS",
    "PAD_ID",
    "Parser",
    "UNK_ID",
    "CachedStep",
    "Ensemble",
    "EnsembleStep",
    "RecomputeStep",
    "SEARCH_OPTIONS",
    "SavedModelTranslator",
    "SearchOptions",
    "Translator",
    "TreeConstraint",
    "beam_search",
    "best_hypotheses",
    "decode_lines",
    "filter_logits",
    "greedy_search",
    "length_penalty",
    "make_search_fn",
    "make_step",
    "recompute_beam_search",
    "recompute_greedy_search",
    "resolve_saved_model",
    "sample",
    "translate_in_batches",
    "translate_lines",
]
