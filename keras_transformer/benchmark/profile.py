"""Where time goes: a SavedModel's translation (op time by kind, time against batch size), and a training step.

`op_times` runs a function under TensorFlow's profiler and sums the executed ops'
durations from the trace it writes (`*.xplane.pb`, read with the XSpace protocol buffer
that TensorFlow ships): one entry per op, named `scope/name:Type`. Op time is summed
over threads, so with two threads it can exceed the wall time.

TensorFlow's executor keeps a running cost estimate per op of each function instance; once
an op's falls below ~8,000 cycles (a few microseconds) in unprofiled runs, the op counts as
cheap and is traced only at `host_tracer_level=3`, which TensorFlow 2.21's profiler options
cannot set (it ignores them: "host_tracer_level expects an i value"). A warmed-up function
would lose its cheap ops from the trace, the more of them the longer it ran; so the profiles
here run `fresh_op_times`: a new instance of the function that has only run traced.

`op_kind` sorts the decoder's ops into the parts of a beam-search step, and
`saved_model_profile` puts the two together for a SavedModel: sentences/s at several batch
sizes, and each kind's share of the op time at each batch size.

`training_profile` does the same for a training step (`benchmark.timing.make_train_step`) of
our model and the keras-hub peer on the same batches: each part of the model's share
(`TRAINING_PARTS`) and the top op types. Under XLA on a CPU the trace holds no per-op times
(the compiled cluster runs as one op), so only the step time is reported there.
"""

import collections
import functools
import glob
import re
import tempfile

from keras_transformer.benchmark.timing import (
    fastest_of_alternating,
    make_train_step,
    run_steps,
    warm_up,
)
from keras_transformer.decoding.selection import SCOPE as SELECTION_SCOPE
from keras_transformer.decoding.steps import REORDER_SCOPE

# An executed op's trace event: "scope/name:Type" (not "ExecutorState::Process", nor the
# caller's "EagerLocalExecute: __inference_...", which spans a whole function call).
_OP_EVENT = re.compile(r"^[^\s:]+:[A-Za-z_]\w*$")

# (kind, pattern on "scope/name:Type"), first match wins. The scopes are those of the
# exported search (decoding/beam.py, decoding/steps.py, decoding/selection.py, layers/).
OP_KINDS = (
    (
        "tokenize / detokenize",
        re.compile(r"SentencepieceOp|Sentencepiece|StringJoin|UnicodeTranscode|RaggedTensorTo"),
    ),
    # Every layer's cached keys/values follow the hypotheses kept (and drop finished sentences).
    ("beam reorder (gathers of the cache)", re.compile(rf"/{REORDER_SCOPE}(_\d+)?/")),
    ("encoder", re.compile(r"(^|/)encode[r_]|encoder_layer")),
    ("decoder self-attention", re.compile(r"self_attention")),
    ("decoder cross-attention", re.compile(r"cross_attention")),
    ("decoder feed-forward", re.compile(r"feed_forward")),
    (
        "output projection (logits)",
        re.compile(r"(token_embedding|logits|shared_embedding).*:(MatMul|BatchMatMulV2|Einsum)"),
    ),
    ("layer norm", re.compile(r"layer_norm")),
    (
        "log-softmax, top-k, scores",
        re.compile(
            rf"/{SELECTION_SCOPE}(_\d+)?/|:(TopKV2|LogSoftmax|Softmax|Max|Sum|ArgMax|Exp|Log|Sub|Mul|RealDiv)$"
        ),
    ),
    (
        "while-loop control",
        re.compile(r":(Enter|Exit|Merge|Switch|NextIteration|LoopCond|Identity|Less|LogicalAnd)$"),
    ),
)
OTHER = "other"


# (part, pattern on "scope/name:Type"), first match wins; the scopes of our model and of the
# keras-hub peer (`benchmark.peers`). Ops outside both models are the loss and the step's own.
TRAINING_PARTS = (
    ("optimizer (Adam)", re.compile(r"(^|/)adam(_\d+)?/|ResourceApplyAdam")),
    ("layer norm", re.compile(r"layer_?norm")),
    ("dropout", re.compile(r"dropout")),
    ("output projection and embedding", re.compile(r"token_embedding|reversible_embedding")),
    ("attention", re.compile(r"attention")),
    ("feed-forward", re.compile(r"feed_?forward")),
    (
        "positions and the rest of the model",
        re.compile(r"(^|/)(transformer|keras_hub_transformer)(_\d+)?/"),
    ),
)
OUTSIDE = "loss and step (outside the model)"


def training_part(name):
    """The part of a training step that the op `scope/name:Type` belongs to (`TRAINING_PARTS`).

    >>> training_part("gradient_tape/transformer/decoder_layer_0/self_attention/einsum_1/Einsum:Einsum")
    'attention'
    >>> training_part("gradient_tape/keras_hub_transformer/decoder/feedforward_output_dense/Tensordot:MatMul")
    'feed-forward'
    >>> training_part("ReduceLogSumExp/Sub:Sub")
    'loss and step (outside the model)'
    """
    for part, pattern in TRAINING_PARTS:
        if pattern.search(name):
            return part
    return OUTSIDE


def training_profile(models, config, batches, jit_compile=False, log=print):
    """Where a training step's time goes, for each of `models` on the same `batches`.

    Args:
        models: `{name: keras model}` with our inputs and outputs.
        config: the `TransformerConfig` (label smoothing, warmup of the step).
        batches: a list of `(inputs, labels)`; each model is warmed up on every shape first.
        jit_compile: compile the steps with XLA (then only the step time is measured).
        log: prints the table.

    Returns:
        `{name: {"step_seconds": float, "op_seconds": float, "parts": {part: s}, "types": {type: s}}}`.
    """
    steps = {name: make_train_step(model, config, jit_compile) for name, model in models.items()}
    for step in steps.values():
        warm_up(step, batches)
    fastest = fastest_of_alternating(
        {name: functools.partial(run_steps, step, batches) for name, step in steps.items()},
        rounds=2,
    )
    results = {}
    for name in steps:
        # A new step (and optimizer) for the profile: the timed step ran unprofiled
        # (`fresh_op_times`).
        make_steps = functools.partial(_steps_of_new_step, models[name], config, batches)
        times = {} if jit_compile else fresh_op_times(make_steps, batches)[1]
        parts = collections.Counter()
        for op, seconds in times.items():
            parts[training_part(op)] += seconds
        results[name] = {
            "step_seconds": fastest[name][0] / len(batches),
            "op_seconds": sum(times.values()),
            "parts": dict(parts.most_common()),
            "types": by_type(times),
        }
    log(format_training_profile(results, len(batches), jit_compile))
    return results


def _steps_of_new_step(model, config, batches):
    """`run_steps` over a new `make_train_step(model, config)`, for `fresh_op_times`: traced for
    each batch shape but never run (a second step tracing in its calls would set off
    TensorFlow's warning about a `tf.function` created in a loop)."""
    step = make_train_step(model, config)
    for inputs, labels in batches:
        step.get_concrete_function(inputs, labels)
    return functools.partial(run_steps, step)


def format_training_profile(results, num_batches, jit_compile=False):
    """Markdown: step time per model, each part's share of the op time, and the top op types."""
    names = list(results)
    lines = [
        f"| {'XLA' if jit_compile else 'graph mode'}, {num_batches} batches | {' | '.join(names)} |",
        f"|---|{'---|' * len(names)}",
        "| seconds per step (fastest of 2 alternating rounds) | "
        + " | ".join(f"{results[name]['step_seconds']:.3f}" for name in names)
        + " |",
    ]
    if jit_compile:
        return "\n".join(lines + ["", "(XLA on a CPU: the trace holds no per-op times)"])
    lines.append(
        "| op time summed over threads (s) | "
        + " | ".join(f"{results[name]['op_seconds']:.1f}" for name in names)
        + " |"
    )
    for part in [part for part, _ in TRAINING_PARTS] + [OUTSIDE]:
        shares = [
            results[name]["parts"].get(part, 0.0) / max(results[name]["op_seconds"], 1e-12)
            for name in names
        ]
        lines.append(f"| {part} | " + " | ".join(f"{share:.0%}" for share in shares) + " |")
    lines.append("")
    for name in names:
        top = ", ".join(
            f"{op} {seconds / max(results[name]['op_seconds'], 1e-12):.0%}"
            for op, seconds in results[name]["types"].items()
        )
        lines.append(f"{name}, top op types: {top}")
    return "\n".join(lines)


def op_kind(name):
    """The part of the search that the op `scope/name:Type` belongs to (`OP_KINDS`), else "other".

    >>> op_kind("StatefulPartitionedCall/while/body/_101/while/reorder_cache/GatherV2_15:GatherV2")
    'beam reorder (gathers of the cache)'
    >>> op_kind("while/body/_1/while/top_k_in_two_stages/GatherV2:GatherV2")
    'log-softmax, top-k, scores'
    >>> op_kind("while/body/_1/while/decoder_layer_0/self_attention/einsum/Einsum:Einsum")
    'decoder self-attention'
    >>> op_kind("while/body/_1/add_4:AddV2")
    'other'

    oneDNN's kernels (`_MklMatMul`, `_MklSoftmax`, ... on CPUs where TensorFlow uses them)
    count as the ops they implement:

    >>> op_kind("while/body/_185/while/token_embedding_3/Tensordot/FoldTransposeIntoMatMul_MatMul:_MklMatMul")
    'output projection (logits)'
    """
    name = name.replace(":_Mkl", ":")
    for kind, pattern in OP_KINDS:
        if pattern.search(name):
            return kind
    return OTHER


def read_op_times(logdir):
    """`{op name: seconds}` summed over the trace files under `logdir`.

    Every thread's op events count: an op TensorFlow deems cheap may run inline on the
    thread that made its input ready, the caller's included, not only on the compute pool.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    totals = collections.Counter()
    paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    if not paths:
        raise FileNotFoundError(f"No profiler trace (*.xplane.pb) under {logdir}")
    for path in paths:
        space = xplane_pb2.XSpace()
        with open(path, "rb") as trace:
            space.ParseFromString(trace.read())
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if _OP_EVENT.match(name):
                        totals[name] += event.duration_ps * 1e-12
    return dict(totals)


def op_times(function, *args, **kwargs):
    """Run `function(*args, **kwargs)` once under the profiler; returns `(result, {op name: seconds})`."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            result = function(*args, **kwargs)
        finally:
            tf.profiler.experimental.stop()
        return result, read_op_times(logdir)


def fresh_op_times(make_function, *args, **kwargs):
    """`op_times` of a new instance `make_function()`, called on `*args, **kwargs`.

    The instance has never run outside the profiler, so every op it executes is in the
    trace: TensorFlow stops tracing an op only after unprofiled runs found it cheap (see the
    module's docstring). Its first call instantiates the function; that is not op time.
    """
    return op_times(make_function(), *args, **kwargs)


def by_kind(times):
    """`{kind: seconds}` of `op_times`' result, largest first."""
    totals = collections.Counter()
    for name, seconds in times.items():
        totals[op_kind(name)] += seconds
    return dict(totals.most_common())


def by_type(times, top=10):
    """The `top` op types (`MatMul`, `GatherV2`, ...) by summed seconds, largest first."""
    totals = collections.Counter()
    for name, seconds in times.items():
        totals[name.rsplit(":", 1)[-1]] += seconds
    return dict(totals.most_common(top))


def saved_model_profile(
    export_dir, sources, batch_sizes=(16, 32, 64, 128), rounds=2, profile_sentences=256, log=print
):
    """Sentences/s and op time by kind of a text-in/text-out SavedModel at each batch size.

    Args:
        export_dir: the SavedModel (its `serving_default` signature).
        sources: sentences; each batch size translates all of them in the timed rounds.
        batch_sizes: sentences per signature call.
        rounds: timing rounds, alternating over the batch sizes; each keeps its fastest.
        profile_sentences: the op times come from one profiled pass over the first this many
            sentences, on a new load of the SavedModel (`fresh_op_times`); the profiler holds
            every op event in memory (~24 GB for 1,000 sentences of the Multi30k model).
        log: prints the two tables.

    Returns:
        `{batch_size: {"sentences_per_second": float, "wall_seconds": float, "op_seconds": float,
        "kinds": {kind: seconds}, "types": {type: seconds}}}`.
    """
    from keras_transformer.decoding.translator import SavedModelTranslator, translate_in_batches

    translate_batch = SavedModelTranslator(export_dir).translate_batch
    translators = {
        size: functools.partial(translate_in_batches, translate_batch, batch_size=size)
        for size in batch_sizes
    }
    for size, translator in translators.items():
        translator(sources[:size])  # trace this batch shape's graph
    fastest = fastest_of_alternating(
        {size: functools.partial(translator, sources) for size, translator in translators.items()},
        rounds,
    )
    best = {size: seconds for size, (seconds, _) in fastest.items()}
    results = {}
    for size in (
        batch_sizes
    ):  # on a new load of the SavedModel: `translators` ran unprofiled (`fresh_op_times`)
        _, times = fresh_op_times(
            functools.partial(_translator_of_new_load, export_dir, size),
            sources[:profile_sentences],
        )
        results[size] = {
            "sentences_per_second": len(sources) / best[size],
            "wall_seconds": best[size],
            "op_seconds": sum(times.values()),
            "kinds": by_kind(times),
            "types": by_type(times),
        }
    log(format_profile(results, len(sources), profile_sentences))
    return results


def _translator_of_new_load(export_dir, batch_size):
    """`translate_in_batches` over a new load of the SavedModel, for `fresh_op_times`."""
    from keras_transformer.decoding.translator import SavedModelTranslator, translate_in_batches

    return functools.partial(
        translate_in_batches,
        SavedModelTranslator(export_dir).translate_batch,
        batch_size=batch_size,
    )


def profile_run(
    model_dir, sources, batch_sizes=(16, 32, 64, 128), rounds=2, vocabulary_map=None, log=print
):
    """`saved_model_profile` of a trained run's export (the run's search settings, `TranslationModule`;
    `vocabulary_map`: over its shortlist, `decoding.shortlist`)."""
    from keras_transformer.decoding.options import SearchOptions
    from keras_transformer.export import TranslationModule, export_saved_model
    from keras_transformer.runs import load_run

    model, tokenizer, config = load_run(model_dir)
    search = SearchOptions.from_config(config, "beam").kwargs()
    with tempfile.TemporaryDirectory() as workdir:
        exported = export_saved_model(
            TranslationModule(model, tokenizer, **search, vocabulary_map=vocabulary_map),
            workdir,
            name="profile",
            verify=False,
            check_ops=False,
        )
        shortlist = (
            "" if vocabulary_map is None else f", vocabulary map {vocabulary_map.description}"
        )
        log(
            f"SavedModel profile: beam {search['beam_size']}, alpha {search['length_penalty']}{shortlist}, "
            f"{len(sources)} sentences, fastest of {rounds} alternating rounds per batch size"
        )
        return saved_model_profile(str(exported.path), sources, batch_sizes, rounds, log=log)


def format_profile(results, num_sentences, profile_sentences=256):
    """Markdown tables: sentences/s per batch size, and each kind's share of the op time."""
    sizes = list(results)
    lines = [
        f"| batch size | {' | '.join(str(size) for size in sizes)} |",
        f"|---|{'---|' * len(sizes)}",
        f"| sentences/s ({num_sentences} sentences) | "
        + " | ".join(f"{results[size]['sentences_per_second']:.1f}" for size in sizes)
        + " |",
        f"| op time summed over threads (s), first {min(profile_sentences, num_sentences)} sentences | "
        + " | ".join(f"{results[size]['op_seconds']:.1f}" for size in sizes)
        + " |",
    ]
    kinds = [
        kind for kind, _ in OP_KINDS if any(kind in results[size]["kinds"] for size in sizes)
    ] + [OTHER]
    for kind in kinds:
        shares = [
            results[size]["kinds"].get(kind, 0.0) / max(results[size]["op_seconds"], 1e-12)
            for size in sizes
        ]
        lines.append(f"| {kind} | " + " | ".join(f"{share:.0%}" for share in shares) + " |")
    lines.append("")
    for size in sizes:
        top = ", ".join(
            f"{name} {seconds / max(results[size]['op_seconds'], 1e-12):.0%}"
            for name, seconds in results[size]["types"].items()
        )
        lines.append(f"batch {size}, top op types: {top}")
    return "\n".join(lines)
