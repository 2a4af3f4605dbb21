"""Beam search with the GNMT length penalty and early stopping (paper section 6.1).

Shape letters: B batch, K beam size, N = B * K, L output buffer length, V vocabulary size,
R = num_return.

One loop over a step function (see `steps.py`), written in `keras.ops` for every Keras
backend: on TensorFlow a `tf.while_loop` (static shapes under XLA) that runs eagerly, under
`tf.function`, under XLA and inside an exported SavedModel, and where shapes may change,
lets the sentences that are done leave the batch; on JAX a `lax.while_loop` that
`jax.jit` compiles; on PyTorch a Python loop.

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

from keras import ops

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID
from keras_transformer.decoding import lengths as lengths_lib
from keras_transformer.decoding import selection
from keras_transformer.decoding.greedy import check_backend
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.decoding.shortlist import OUTPUT_IDS
from keras_transformer.decoding.steps import loop_shapes_may_change, make_step, search_loop

_NEG_INF = -math.inf


def _check_beam_arguments(beam_size, length_penalty, num_return):
    SearchOptions(
        beam_size=beam_size, length_penalty=length_penalty, num_return=num_return
    )  # raises naming the value


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

    The same code runs on every Keras backend, the constraint included; `use_cache=False`
    needs TensorFlow.

    References:
        Vaswani et al., 2017, section 6.1; Wu et al., 2016 (GNMT), section 7.
    """
    check_backend("beam search", use_cache)
    _check_beam_arguments(beam_size, length_penalty, num_return)
    alpha = float(length_penalty)
    step_fn = make_step(model, use_cache)
    source_ids = lengths_lib.as_source_ids(source_ids)
    buffer_size = lengths_lib.buffer_length(
        getattr(step_fn, "model", None), source_ids, max_length, max_output_offset
    )
    limits = lengths_lib.output_limits(source_ids, buffer_size, max_output_offset)  # (B,)
    batch_size = ops.shape(source_ids)[0]
    k = beam_size

    state = step_fn.initialize(source_ids, buffer_size, num_copies=k)  # rows b * K + beam
    # A vocabulary shortlist (`shortlist.ShortlistStep`): the logits cover its tokens only.
    shortlisted = isinstance(state, dict) and OUTPUT_IDS in state
    if shortlisted and constraint is not None:
        raise ValueError(
            "A search constraint needs the full vocabulary: pass no vocabulary shortlist with it"
        )
    # Sentences that are done leave the working set (their decoder rows are no longer
    # computed) when the step can drop them and shapes may change (TensorFlow outside XLA).
    # Elsewhere the working set is the batch (A = B) and done sentences idle: they are no
    # longer `valid`, so nothing they compute enters the results.
    compact = bool(getattr(step_fn, "can_drop_sentences", False)) and loop_shapes_may_change()
    active = ops.arange(batch_size, dtype="int32")  # (A,): the sentences still searched, A <= B

    alive_ids = ops.concatenate(
        [
            ops.full((batch_size, k, 1), BOS_ID, "int32"),
            ops.zeros((batch_size, k, buffer_size), "int32"),
        ],
        axis=2,
    )  # (A, K, L + 1)
    # Only beam 0 is alive at first, so the first step does not expand K copies of BOS.
    alive_log_probs = ops.tile(
        ops.convert_to_tensor([[0.0] + [_NEG_INF] * (k - 1)], "float32"), (batch_size, 1)
    )  # (A, K)
    finished_ids = ops.zeros_like(alive_ids)  # (B, K, L + 1)
    finished_scores = ops.full((batch_size, k), _NEG_INF, "float32")  # (B, K)
    done = ops.less_equal(limits, 0)  # (B,)
    words = constraint.source_words(source_ids) if constraint is not None else None  # (B,)
    best_possible_penalty = lengths_lib.length_penalty(limits, alpha)  # (B,) lp(limit)
    width = ops.shape(alive_ids)[2]
    slots = ops.arange(width, dtype="int32")  # (L + 1,)
    in_first_k = (ops.arange(2 * k) < k)[None, :]  # (1, 2K)

    def cond(index, active, alive_ids, alive_log_probs, finished_ids, finished_scores, done, state):
        return ops.logical_and(index < buffer_size, ops.logical_not(ops.all(done)))

    def body(index, active, alive_ids, alive_log_probs, finished_ids, finished_scores, done, state):
        def of_active(tensor):  # (B, ...) -> (A, ...)
            return ops.take(tensor, active, axis=0) if compact else tensor

        def set_active(tensor, values):  # (B, ...) with rows `active` set to `values (A, ...)`
            return ops.scatter_update(tensor, active[:, None], values) if compact else values

        num_active = ops.shape(alive_ids)[0]
        flat_ids = ops.reshape(alive_ids, (-1, width))  # (A * K, L + 1)
        logits, state = step_fn.step(
            state, flat_ids, index
        )  # (A * K, V), or (A * K, V') over a shortlist
        output_ids = state[OUTPUT_IDS] if shortlisted else None  # (V',): the token of each logit
        log_probs = lengths_lib.mask_banned(
            ops.log_softmax(logits, axis=-1), output_ids
        )  # not renormalized
        if constraint is not None:  # per hypothesis: its sentence's words and limit
            log_probs = constraint.apply(
                log_probs,
                flat_ids,
                index,
                ops.repeat(of_active(words), k, axis=0),
                ops.repeat(of_active(limits), k, axis=0),
            )
        vocabulary_size = ops.shape(log_probs)[-1]
        log_probs = ops.reshape(log_probs, (num_active, k, vocabulary_size))  # (A, K, V)
        active_done = of_active(done)  # (A,)
        active_limits = of_active(limits)  # (A,)

        # 1. the 2K best one-token extensions
        candidates = alive_log_probs[:, :, None] + log_probs  # (A, K, V)
        candidates = ops.reshape(
            candidates, (num_active, k * vocabulary_size)
        )  # static width for selection.top_k
        top_log_probs, top_indices = selection.top_k(candidates, 2 * k)  # (A, 2K), as ops.top_k
        parents = top_indices // vocabulary_size  # (A, 2K)
        tokens = top_indices % vocabulary_size  # (A, 2K)
        if shortlisted:
            tokens = ops.take(output_ids, tokens, axis=0)  # positions in the shortlist -> token ids
        top_ids = selection.take_per_row(alive_ids, parents)  # (A, 2K, L + 1)
        top_ids = ops.where(ops.equal(slots, index + 1)[None, None, :], tokens[:, :, None], top_ids)
        valid = (top_log_probs > _NEG_INF) & ops.logical_not(active_done)[:, None]
        ended = ops.equal(tokens, EOS_ID) | (index + 1 >= active_limits)[:, None]

        # 2. finished: merge the new ones (ranked in the first K) into the finished set
        normalized = top_log_probs / lengths_lib.length_penalty(index + 1, alpha)  # (A, 2K)
        new_scores = ops.where(valid & ended & in_first_k, normalized, _NEG_INF)
        merged_scores = ops.concatenate([of_active(finished_scores), new_scores], axis=1)  # (A, 3K)
        merged_ids = ops.concatenate([of_active(finished_ids), top_ids], axis=1)  # (A, 3K, L + 1)
        active_scores, picked = ops.top_k(merged_scores, k=k)  # (A, K), sorted
        picked = ops.cast(picked, "int32")
        finished_scores = set_active(finished_scores, active_scores)
        finished_ids = set_active(finished_ids, selection.take_per_row(merged_ids, picked))

        # 3. alive: the K best that did not end; the cache follows their parents
        continuing = ops.where(valid & ops.logical_not(ended), top_log_probs, _NEG_INF)
        alive_log_probs, picked = ops.top_k(continuing, k=k)  # (A, K)
        picked = ops.cast(picked, "int32")
        alive_ids = selection.take_per_row(top_ids, picked)  # (A, K, L + 1)
        sentence_rows = ops.arange(num_active, dtype="int32")[:, None] * k  # (A, 1)
        parent_rows = selection.take_per_row(parents, picked) + sentence_rows  # (A, K)

        # 4. early stopping: can any alive hypothesis still beat the num_return-th finished?
        bound = ops.max(alive_log_probs, axis=1) / of_active(best_possible_penalty)  # (A,)
        active_done = active_done | (active_scores[:, num_return - 1] >= bound)
        done = set_active(done, active_done)
        if compact:  # keep the sentences that go on (A' <= A), and their decoder rows
            keep = ops.nonzero(ops.logical_not(active_done))[0]  # (A',) int32
            active, alive_ids, alive_log_probs, parent_rows = (
                ops.take(tensor, keep, axis=0)
                for tensor in (active, alive_ids, alive_log_probs, parent_rows)
            )
            state = step_fn.reorder(state, ops.reshape(parent_rows, (-1,)), sentences=keep)
        else:
            state = step_fn.reorder(state, ops.reshape(parent_rows, (-1,)))
        return (
            index + 1,
            active,
            alive_ids,
            alive_log_probs,
            finished_ids,
            finished_scores,
            done,
            state,
        )

    loop_vars = (
        ops.convert_to_tensor(0, "int32"),
        active,
        alive_ids,
        alive_log_probs,
        finished_ids,
        finished_scores,
        done,
        state,
    )
    # With `compact` the working set's leading axis shrinks (the full-batch results keep
    # theirs); a growing cache's length axis grows.
    rows_vary = (False, compact, compact, compact, False, False, False, compact)
    _, _, _, _, finished_ids, finished_scores, _, _ = search_loop(cond, body, loop_vars, rows_vary)
    return finished_ids[:, :num_return, 1:], finished_scores[:, :num_return]


def recompute_beam_search(
    model,
    source_ids,
    beam_size=4,
    length_penalty=0.6,
    max_output_offset=50,
    max_length=None,
    num_return=1,
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
