"""Decoding speed: cached versus recompute-the-prefix search on the same model and inputs.

Every configuration (search method x decoder step) decodes the same batches of source ids
with a `decoding.make_search_fn` function traced once beforehand (the warm-up call is not
timed), and reports sentences and output tokens per second and the time per output token.
With several repeats the fastest pass counts (the least disturbed by other load on the
machine), for every configuration alike.
"""

import dataclasses
import time

import numpy as np

from keras_transformer.data.tokenizer import PAD_ID
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.decoding.searcher import best_hypotheses, make_search_fn
from keras_transformer.decoding.text import encode_source


@dataclasses.dataclass(frozen=True)
class DecodingSpeed:
    """The speed of one search configuration.

    Attributes:
        name: e.g. "greedy" or "beam4".
        use_cache: cached decoder step (True) or recomputed prefix (False).
        sentences: sentences decoded (per repeat).
        tokens: output tokens of the best hypotheses (EOS included, per repeat).
        seconds: wall time of one timed pass over all sentences (the fastest of the repeats).
        mean_seconds: the mean over the repeats.
        warmup_seconds: the untimed first call (tracing and graph optimization).
        outputs: the best hypotheses' token ids, one array per sentence (for comparing
            configurations).
    """

    name: str
    use_cache: bool
    sentences: int
    tokens: int
    seconds: float
    warmup_seconds: float
    outputs: list = dataclasses.field(repr=False, compare=False)
    mean_seconds: float = None

    @property
    def milliseconds_per_token(self):
        return 1000.0 * self.seconds / max(self.tokens, 1)

    @property
    def sentences_per_second(self):
        return self.sentences / self.seconds

    @property
    def tokens_per_second(self):
        return self.tokens / self.seconds


def source_batches(tokenizer, texts, batch_size, max_source_length, width_multiple=1):
    """Length-sorted batches of source ids: a list of int32 arrays `(B, S)`.

    With `width_multiple > 1` each batch is right-padded with PAD to a width `S` that is a
    multiple of it (fewer distinct shapes, hence fewer XLA compilations).
    """
    texts = sorted(texts, key=len, reverse=True)
    batches = []
    for start in range(0, len(texts), batch_size):
        ids = encode_source(tokenizer, texts[start : start + batch_size], max_source_length).numpy()
        extra = -ids.shape[1] % width_multiple
        batches.append(np.pad(ids, [(0, 0), (0, extra)], constant_values=PAD_ID) if extra else ids)
    return batches


def time_search(
    model, batches, method, use_cache, name=None, repeats=1, jit_compile=False, **options
):
    """Decode every batch with one search configuration; returns a `DecodingSpeed`.

    The untimed warm-up traces the function on the first batch; under XLA
    (`jit_compile=True`) it also compiles every distinct batch shape.
    """
    search_fn = make_search_fn(
        model, method, use_cache=use_cache, jit_compile=jit_compile, **options
    )
    start = time.perf_counter()
    shapes = {batch.shape: batch for batch in batches} if jit_compile else {None: batches[0]}
    for batch in shapes.values():
        search_fn(batch)["token_ids"].numpy()  # trace (and compile) outside the timed passes
    warmup = time.perf_counter() - start
    outputs = []
    times = []
    for repeat in range(repeats):
        start = time.perf_counter()
        results = [search_fn(source_ids) for source_ids in batches]
        results = [(result["token_ids"].numpy(), result["scores"].numpy()) for result in results]
        times.append(time.perf_counter() - start)
        if repeat == 0:
            for token_ids, scores in results:
                best, _ = best_hypotheses(token_ids, scores)  # (B, L)
                outputs.extend(row[row != PAD_ID] for row in best)
    seconds = min(times)
    tokens = int(sum(len(row) for row in outputs))
    return DecodingSpeed(
        name or method,
        use_cache,
        len(outputs),
        tokens,
        seconds,
        warmup,
        outputs,
        mean_seconds=sum(times) / len(times),
    )


def benchmark_decoding(
    model,
    tokenizer,
    texts,
    beam_size=None,
    batch_size=32,
    repeats=1,
    methods=("greedy", "beam"),
    jit_compile=False,
    **options,
):
    """Time greedy and beam search, each with the cached and the recomputing decoder step.

    Args:
        model: a trained `Transformer`.
        tokenizer: its tokenizer.
        texts: source sentences (the same for every configuration).
        beam_size: beam width of "beam" (default: the model config's).
        batch_size: sentences per search call.
        repeats: decode the inputs this many times per configuration (the fastest pass
            counts).
        methods: among "greedy" and "beam".
        jit_compile: compile every search with XLA. Source batches are then padded to
            widths that are multiples of 8, and the recompute baseline decodes its whole
            output buffer every step (XLA needs static shapes; see `RecomputeStep`).
        **options: further search options (`max_output_offset`, `length_penalty`, ...);
            unset ones (and None) are the model config's (`SearchOptions.from_config`).

    Returns:
        a list of `DecodingSpeed`: for each method, cached then recompute.
    """
    unknown = sorted(set(methods) - {"greedy", "beam"})
    if unknown:
        raise ValueError(
            f"methods must be among 'greedy' and 'beam'. Received: {', '.join(unknown)}"
        )
    texts = list(texts)
    if not texts:
        raise ValueError("No sentences to decode")
    search = SearchOptions.from_config(model.config, "beam", beam_size=beam_size, **options)
    batches = source_batches(
        tokenizer, texts, batch_size, model.config.max_length, 8 if jit_compile else 1
    )
    results = []
    for method in methods:
        method_options = search.with_method(method).kwargs()
        name = f"beam{search.beam_size}" if method == "beam" else method
        for use_cache in (True, False):
            results.append(
                time_search(
                    model,
                    batches,
                    method,
                    use_cache,
                    name,
                    repeats,
                    jit_compile=jit_compile,
                    **method_options,
                )
            )
    return results


def agreement(first, second):
    """Fraction of sentences for which two `DecodingSpeed` runs produced the same tokens."""
    same = sum(np.array_equal(a, b) for a, b in zip(first.outputs, second.outputs))
    return same / max(len(first.outputs), 1)


def format_speed_table(results):
    """A text table of `benchmark_decoding` results, with the cached/recompute speedups."""
    header = f"{'search':<8} {'decoder':<10} {'sentences':>9} {'tokens':>7} {'seconds':>9} {'sent/s':>9} {'tokens/s':>9}"
    lines = [header, "-" * len(header)]
    for result in results:
        decoder = "cached" if result.use_cache else "recompute"
        lines.append(
            f"{result.name:<8} {decoder:<10} {result.sentences:>9d} {result.tokens:>7d} {result.seconds:>9.3f} "
            f"{result.sentences_per_second:>9.2f} {result.tokens_per_second:>9.1f}"
        )
    lines.append("")
    by_name = {}
    for result in results:
        by_name.setdefault(result.name, {})[result.use_cache] = result
    for name, pair in by_name.items():
        if True in pair and False in pair:
            cached, recompute = pair[True], pair[False]
            lines.append(
                f"{name}: cached/recompute speedup {recompute.seconds / cached.seconds:.1f}x "
                f"(identical outputs for {100 * agreement(cached, recompute):.0f}% of sentences)"
            )
            lines.append(
                f"{name}: ms per output token: cached {cached.milliseconds_per_token:.3f}, "
                f"recompute {recompute.milliseconds_per_token:.3f}"
            )
    return "\n".join(lines)
