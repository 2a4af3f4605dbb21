"""Beam search with the GNMT length penalty and early stopping (paper section 6.1).

Shape letters: B batch, K beam size, N = B * K, L output buffer length, V vocabulary size,
R = num_return.

One `tf.while_loop` over a step function (see `steps.py`; static shapes under XLA): runs
eagerly, under `tf.function`, under XLA and inside an exported SavedModel.

The algorithm, per sentence, at step t (every alive hypothesis has t tokens):

1. Extend each of the K alive hypotheses by every token: K * V candidates with
   log P(y_1..y_t+1) = log P(alive) + log p(token); keep the 2K best (at most K of them
   end with EOS, so at least K can continue).
2. Candidates ranked in the first K that end with EOS, or that reach the sentence's
   length limit, **finish**: they enter a separate finished set (size K) with the
   normalized score log P / lp(|Y|), lp(|Y|) = ((5 + |Y|) / 6)^alpha, |Y| counting EOS.
   Finished hypotheses are never extended again.
3. The K best candidates that did not end become the new alive set; the decoder cache
   rows follow their parents (`step.reorder`).
4. A sentence is done when its `num_return`-th best finished score is >= the best score
   any alive hypothesis could still reach. Log-probabilities only decrease and lp grows
   with the length, so that bound is log P(best alive) / lp(limit) (alpha >= 0). The loop
   ends when every sentence is done (at the latest when all reach their limit).

With `beam_size=1` and `length_penalty=0` this is exactly greedy search.
"""

import math

import tensorflow as tf

from keras_transformer.decoding import lengths as lengths_lib
from keras_transformer.decoding import portable, selection
from keras_transformer.decoding.greedy import on_tensorflow
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.decoding.shortlist import OUTPUT_IDS
from keras_transformer.decoding.steps import loop_shape_invariants, make_step
from keras_transformer.layers.tracing import in_xla_context

_NEG_INF = -math.inf


def _check_beam_arguments(beam_size, length_penalty, num_return):
    SearchOptions(beam_size=beam_size, length_penalty=length_penalty, num_return=num_return)  # raises naming the value


def beam_search(
    model,
    source_ids,
    beam_size=4,
    length_penalty=0.6,
    max_output_offset=50,
    max_length=None,
    num_return=1,
    use_cache=True,
    constraint=None,
):
    """Beam search for the hypotheses with the best length-normalized log-probability.

    Args:
        model: a `Transformer` (or any object with its `encode` / `init_cache` /
            `decode_step` / `decode` interface), or a step object from `steps.py`.
        source_ids: int `(B, S)`, sources ending with EOS, right-padded with 0; sources of
            different lengths may share a batch (each gets its own length limit).
        beam_size: K (4 in the paper).
        length_penalty: alpha of lp(Y) = ((5 + |Y|) / 6)^alpha (0.6 in the paper; 0 ranks by
            plain log-probability).
        max_output_offset: sentence `b` produces at most
            `min(source_length_b + max_output_offset, L)` tokens (50 in the paper).
        max_length: the output buffer length `L`: an int for static output shapes, or
            `None` for `S + max_output_offset` (see `greedy_search`).
        num_return: how many hypotheses to return per sentence (<= beam_size).
        use_cache: decode with the key/value cache; False re-runs the full decoder over the
            prefix every step (the baseline).
        constraint: None, or an object whose `apply` masks the ids a hypothesis may not
            take next (`TreeConstraint`: every output a tree over the source's words).

    Returns:
        `(token_ids int32 (B, R, L), scores float32 (B, R))`, best first. Outputs exclude
        BOS, include EOS when produced (a hypothesis cut at its length limit has none),
        PAD (0) after it. Scores are log P(Y | X) / lp(|Y|). A slot the search could not
        fill (only with a tiny vocabulary or zero-probability tokens) has score -inf
        and only PAD.

    Example:

    >>> from keras_transformer import Transformer, get_preset
    >>> from keras_transformer.decoding import beam_search
    >>> model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
    ...                                num_decoder_layers=1, hidden_dim=32, num_heads=2))
    >>> token_ids, scores = beam_search(model, [[5, 6, 7, 3], [8, 3, 0, 0]], num_return=2,
    ...                                 max_length=8)
    >>> tuple(token_ids.shape), tuple(scores.shape)
    ((2, 2, 8), (2, 2))

    On JAX and PyTorch this runs `portable.beam_search` (the same outputs); `use_cache=False`
    and `constraint` need TensorFlow.

    References:
        Vaswani et al., 2017, section 6.1; Wu et al., 2016 (GNMT), section 7.
    """
    if not on_tensorflow("beam search", use_cache, constraint):  # it checks the arguments itself
        return portable.beam_search(
            model, source_ids, beam_size, length_penalty, max_output_offset, max_length, num_return
        )
    _check_beam_arguments(beam_size, length_penalty, num_return)
    alpha = float(length_penalty)
    step_fn = make_step(model, use_cache)
    source_ids = lengths_lib.as_source_ids(source_ids)
    buffer_size = lengths_lib.buffer_length(getattr(step_fn, "model", None), source_ids, max_length, max_output_offset)
    limits = lengths_lib.output_limits(source_ids, buffer_size, max_output_offset)  # (B,)
    batch_size = tf.shape(source_ids)[0]
    k = beam_size

    state = step_fn.initialize(source_ids, buffer_size, num_copies=k)  # rows b * K + beam
    # A vocabulary shortlist (`shortlist.ShortlistStep`): the logits cover its tokens only.
    shortlisted = isinstance(state, dict) and OUTPUT_IDS in state
    if shortlisted and constraint is not None:
        raise ValueError("A search constraint needs the full vocabulary: pass no vocabulary shortlist with it")
    # Sentences that are done leave the working set (their decoder rows are no longer
    # computed) when the step can drop them; under XLA shapes must stay static.
    compact = bool(getattr(step_fn, "can_drop_sentences", False)) and not in_xla_context()
    active = tf.range(batch_size)  # (A,): the sentences still searched, A <= B
    alive_ids = tf.concat(
        [tf.fill([batch_size, k, 1], BOS_ID), tf.zeros([batch_size, k, buffer_size], tf.int32)], axis=2
    )  # (A, K, L + 1)
    # Only beam 0 is alive at first, so the first step does not expand K copies of BOS.
    alive_log_probs = tf.tile(tf.constant([[0.0] + [_NEG_INF] * (k - 1)], tf.float32), [batch_size, 1])  # (A, K)
    finished_ids = tf.zeros_like(alive_ids)  # (B, K, L + 1)
    finished_scores = tf.fill([batch_size, k], _NEG_INF)  # (B, K)
    done = tf.less_equal(limits, 0)  # (B,)
    words = constraint.source_words(source_ids) if constraint is not None else None  # (B,)
    best_possible_penalty = lengths_lib.length_penalty(limits, alpha)  # (B,) lp(limit)
    width = tf.shape(alive_ids)[2]
    slots = tf.range(width)  # (L + 1,)
    in_first_k = (tf.range(2 * k) < k)[None, :]  # (1, 2K)

    def cond(index, active, alive_ids, alive_log_probs, finished_ids, finished_scores, done, state):
        return tf.logical_and(index < buffer_size, tf.logical_not(tf.reduce_all(done)))

    def body(index, active, alive_ids, alive_log_probs, finished_ids, finished_scores, done, state):
        num_active = tf.shape(active)[0]
        flat_ids = tf.reshape(alive_ids, [-1, width])  # (A * K, L + 1)
        logits, state = step_fn.step(state, flat_ids, index)  # (A * K, V), or (A * K, V') over a shortlist
        output_ids = state[OUTPUT_IDS] if shortlisted else None  # (V',): the token of each logit
        log_probs = lengths_lib.mask_banned(tf.nn.log_softmax(logits, axis=-1), output_ids)  # not renormalized
        if constraint is not None:  # per hypothesis: its sentence's words and limit
            log_probs = constraint.apply(
                log_probs, flat_ids, index, tf.repeat(tf.gather(words, active), k), tf.repeat(tf.gather(limits, active), k)
            )
        vocabulary_size = log_probs.shape[-1] or tf.shape(log_probs)[-1]
        log_probs = tf.reshape(log_probs, [num_active, k, vocabulary_size])  # (A, K, V)
        active_done = tf.gather(done, active)  # (A,)
        active_limits = tf.gather(limits, active)  # (A,)

        # 1. the 2K best one-token extensions
        candidates = alive_log_probs[:, :, None] + log_probs  # (A, K, V)
        candidates = tf.reshape(candidates, [num_active, k * vocabulary_size])  # static width for selection.top_k
        top_log_probs, top_indices = selection.top_k(candidates, 2 * k)  # (A, 2K), as tf.math.top_k
        parents = top_indices // vocabulary_size  # (A, 2K)
        tokens = top_indices % vocabulary_size  # (A, 2K)
        if shortlisted:
            tokens = tf.gather(output_ids, tokens)  # positions in the shortlist -> token ids
        top_ids = tf.gather(alive_ids, parents, batch_dims=1)  # (A, 2K, L + 1)
        top_ids = tf.where(tf.equal(slots, index + 1)[None, None, :], tokens[:, :, None], top_ids)
        valid = (top_log_probs > _NEG_INF) & tf.logical_not(active_done)[:, None]
        ended = tf.equal(tokens, EOS_ID) | (index + 1 >= active_limits)[:, None]

        # 2. finished: merge the new ones (ranked in the first K) into the finished set
        normalized = top_log_probs / lengths_lib.length_penalty(index + 1, alpha)  # (A, 2K)
        new_scores = tf.where(valid & ended & in_first_k, normalized, _NEG_INF)
        merged_scores = tf.concat([tf.gather(finished_scores, active), new_scores], axis=1)  # (A, 3K)
        merged_ids = tf.concat([tf.gather(finished_ids, active), top_ids], axis=1)  # (A, 3K, L + 1)
        active_scores, picked = tf.math.top_k(merged_scores, k=k)  # (A, K), sorted
        rows = active[:, None]
        finished_scores = tf.tensor_scatter_nd_update(finished_scores, rows, active_scores)
        finished_ids = tf.tensor_scatter_nd_update(finished_ids, rows, tf.gather(merged_ids, picked, batch_dims=1))

        # 3. alive: the K best that did not end; the cache follows their parents
        continuing = tf.where(valid & tf.logical_not(ended), top_log_probs, _NEG_INF)
        alive_log_probs, picked = tf.math.top_k(continuing, k=k)  # (A, K)
        alive_ids = tf.gather(top_ids, picked, batch_dims=1)  # (A, K, L + 1)
        parent_rows = tf.gather(parents, picked, batch_dims=1) + tf.range(num_active)[:, None] * k  # (A, K)

        # 4. early stopping: can any alive hypothesis still beat the num_return-th finished?
        bound = tf.reduce_max(alive_log_probs, axis=1) / tf.gather(best_possible_penalty, active)  # (A,)
        active_done = active_done | (active_scores[:, num_return - 1] >= bound)
        done = tf.tensor_scatter_nd_update(done, rows, active_done)
        if compact:  # keep the sentences that go on (A' <= A), and their decoder rows
            keep = tf.cast(tf.reshape(tf.where(tf.logical_not(active_done)), [-1]), tf.int32)  # (A',)
            active, alive_ids, alive_log_probs, parent_rows = (
                tf.gather(tensor, keep) for tensor in (active, alive_ids, alive_log_probs, parent_rows)
            )
            state = step_fn.reorder(state, tf.reshape(parent_rows, [-1]), sentences=keep)
        else:
            alive_log_probs = tf.where(active_done[:, None], _NEG_INF, alive_log_probs)
            state = step_fn.reorder(state, tf.reshape(parent_rows, [-1]))
        return index + 1, active, alive_ids, alive_log_probs, finished_ids, finished_scores, done, state

    loop_vars = (tf.constant(0, tf.int32), active, alive_ids, alive_log_probs, finished_ids, finished_scores, done, state)
    # With `compact` the working set's leading axis shrinks (the full-batch results keep
    # theirs); a growing cache's length axis grows.
    shape_invariants = (
        tf.TensorShape([]),
        *loop_shape_invariants((active, alive_ids, alive_log_probs), rows_vary=compact),
        finished_ids.shape,
        finished_scores.shape,
        done.shape,
        loop_shape_invariants(state, rows_vary=compact),
    )
    _, _, _, _, finished_ids, finished_scores, _, _ = tf.while_loop(
        cond, body, loop_vars, shape_invariants=shape_invariants
    )
    return finished_ids[:, :num_return, 1:], finished_scores[:, :num_return]


def recompute_beam_search(
    model, source_ids, beam_size=4, length_penalty=0.6, max_output_offset=50, max_length=None, num_return=1
):
    """`beam_search` without the cache: the full decoder re-runs over the prefix every step."""
    return beam_search(
        model,
        source_ids,
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_output_offset=max_output_offset,
        max_length=max_length,
        num_return=num_return,
        use_cache=False,
    )
