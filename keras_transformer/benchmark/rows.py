"""The benchmark's rows: each compares two measurements taken in the same run on the same machine.

A `Row` is `(name, ours, base, ratio, target)`: `ratio` is ours over the peer or base
(>= `target` is the goal; `None`: no target). Printed by `format_table`, plotted by
`plot_ratios` (`benchmark.report`). Every name starts with the row's key, e.g.
`keras_hub_per_batch: ...`, the name docs/results.md and the plot use.
"""

import collections
import functools
import tempfile
from pathlib import Path

import keras

from keras_transformer.benchmark.batches import padded_batches, real_lengths
from keras_transformer.benchmark.decoding import benchmark_decoding
from keras_transformer.benchmark.flops import (
    MATMUL_SIZE,
    matmul_flops_per_second,
    training_flops,
)
from keras_transformer.benchmark.peaks import hardware_peak
from keras_transformer.benchmark.peers import PeerTargetRows, keras_hub_transformer
from keras_transformer.benchmark.report import format_row, format_table
from keras_transformer.benchmark.timing import (
    compare_steps,
    compare_steps_per_batch,
    fastest_of_alternating,
    make_train_step,
)
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.models.transformer import Transformer
from keras_transformer.runs import load_run

Row = collections.namedtuple("Row", ["name", "ours", "base", "ratio", "target"])

# The ctranslate2 rows' engines over a vocabulary shortlist (`ctranslate2_rows(..., vocabulary_map=...)`).
SHORTLIST_ENGINE = "SavedModel + shortlist"
INT8_ENGINE = "SavedModel int8"
VMAP_SUFFIX = " + vmap"


def training_rows(
    config,
    pairs,
    tokenizer,
    precision="float32",
    steps=30,
    rounds=3,
    batch_tokens=4096,
    padded_length=32,
    padded_batch=64,
    jit_compile=False,
    seed=0,
    fma_units=2,
    matmul_size=MATMUL_SIZE,
    log=print,
):
    """The training rows: our model and pipeline against the keras-hub peer (see experiments/benchmark.py).

    Args:
        config: the `TransformerConfig` of both models.
        pairs: training sentence pairs.
        tokenizer: a `data.Tokenizer` for them.
        precision: the dtype policy of both models.
        steps: timed training steps per measurement.
        rounds: alternating timing rounds; each side keeps its fastest.
        batch_tokens: token budget per bucketed batch.
        padded_length, padded_batch: the keras_hub_padded row's fixed batches (sentences cut/padded to
            `padded_length`, `padded_batch` per batch).
        jit_compile: compile both training steps with XLA.
        seed: of the bucketed pipeline.
        fma_units: FMA units per CPU core for the peak of the mfu row.
        matmul_size: the matmul_fraction row's measured matmul, of `matmul_size`-square matrices.
        log: prints the parameter counts, the peak's inputs and each row as it is measured
            (the whole table takes minutes on a CPU).

    Returns:
        a list of `Row`s.
    """
    policy = precision
    ours = Transformer(config, dtype=policy)
    peer = keras_hub_transformer(config, dtype=policy)
    log(f"config: {config.architecture()}")
    log(f"parameters: ours {ours.count_params():,}, keras-hub {peer.count_params():,}")
    rows = []
    log(format_table([]))  # the header; each row follows as it is measured

    def measured(row):
        rows.append(row)
        log(format_row(row))

    # identical padded batches
    padded = padded_batches(pairs, tokenizer, padded_length, padded_batch, steps)
    ours_step = make_train_step(ours, config, jit_compile)
    peer_step = make_train_step(peer, config, jit_compile)
    ours_seconds, peer_seconds = compare_steps((ours_step, padded), (peer_step, padded), rounds)
    measured(
        Row(
            "keras_hub_padded: train steps/s, identical padded batches",
            len(padded) / ours_seconds,
            len(padded) / peer_seconds,
            peer_seconds / ours_seconds,
            1.25,
        )
    )

    # real target tokens/s, ours vs the peer, both on our bucketed batches, each over a whole pass
    bucketed = list(
        make_dataset(
            pairs, tokenizer, batch_tokens=batch_tokens, max_length=config.max_length, seed=seed
        ).take(steps)
    )
    bucketed_tokens = sum(real_lengths(bucketed)[1])
    ours_seconds, peer_seconds = compare_steps((ours_step, bucketed), (peer_step, bucketed), rounds)
    measured(
        Row(
            "keras_hub_whole_pass: real target tokens/s, same bucketed batches",
            bucketed_tokens / ours_seconds,
            bucketed_tokens / peer_seconds,
            peer_seconds / ours_seconds,
            1.25,
        )
    )

    # the same, the two models taking turns on every batch (see compare_steps_per_batch)
    ours_batch_seconds, peer_batch_seconds = compare_steps_per_batch(
        ours_step, peer_step, bucketed, rounds
    )
    measured(
        Row(
            "keras_hub_per_batch: the same, alternating per batch",
            bucketed_tokens / sum(ours_batch_seconds),
            bucketed_tokens / sum(peer_batch_seconds),
            sum(peer_batch_seconds) / sum(ours_batch_seconds),
            1.25,
        )
    )
    log(format_batch_ratios(bucketed, ours_batch_seconds, peer_batch_seconds))

    # per batch, with the peer's loss on the real target positions too (`PeerTargetRows`): the same
    # training output on both sides, not keras-hub's own
    peer_rows_step = make_train_step(PeerTargetRows(peer, config), config, jit_compile)
    ours_batch_seconds, peer_batch_seconds = compare_steps_per_batch(
        ours_step, peer_rows_step, bucketed, rounds
    )
    measured(
        Row(
            "keras_hub_target_rows: per batch, the peer's loss on real rows too",
            bucketed_tokens / sum(ours_batch_seconds),
            bucketed_tokens / sum(peer_batch_seconds),
            sum(peer_batch_seconds) / sum(ours_batch_seconds),
            1.25,
        )
    )

    # the bucketing gain: our model, bucketed batches vs fixed padding to max_length
    fixed = padded_batches(
        pairs, tokenizer, config.max_length, batch_tokens // config.max_length, steps
    )
    fixed_tokens = sum(real_lengths(fixed)[1])
    bucketed_seconds, fixed_seconds = compare_steps(
        (ours_step, bucketed), (ours_step, fixed), rounds
    )
    bucketed_rate, fixed_rate = bucketed_tokens / bucketed_seconds, fixed_tokens / fixed_seconds
    measured(
        Row(
            "bucketing: real target tokens/s, bucketed vs fixed padding, ours",
            bucketed_rate,
            fixed_rate,
            bucketed_rate / fixed_rate,
            3.0,
        )
    )

    # what skipping the padding gives (`config.skip_padding`): ours against the same weights
    # computing at the padding too, taking turns on every batch
    if config.skip_padding:
        padded_ours = Transformer(config.replace(skip_padding=False), dtype=policy)
        padded_ours.set_weights(ours.get_weights())
        skipping_seconds, padding_seconds = compare_steps_per_batch(
            ours_step, make_train_step(padded_ours, config, jit_compile), bucketed, rounds
        )
        measured(
            Row(
                "skip_padding: the same batches, ours vs ours computing at the padding",
                bucketed_tokens / sum(skipping_seconds),
                bucketed_tokens / sum(padding_seconds),
                sum(padding_seconds) / sum(skipping_seconds),
                None,
            )
        )

    # c. model FLOP utilization on real tokens: against the hardware peak, and (separately)
    # against the float32 matmul rate measured now
    source_lengths, target_lengths = real_lengths(bucketed)
    achieved = training_flops(config, source_lengths, target_lengths) / ours_seconds
    peak = hardware_peak(keras.dtype_policies.get(policy).compute_dtype, fma_units=fma_units)
    log(f"peak: {peak.describe()}")
    measured(
        Row(
            f"mfu: training FLOP/s / {peak.dtype} peak",
            achieved / 1e9,
            peak.flops_per_second / 1e9,
            achieved / peak.flops_per_second,
            None,
        )
    )
    matmul = matmul_flops_per_second(
        size=matmul_size, dtype=peak.dtype if peak.dtype != "tf32" else "float32"
    )
    measured(
        Row(
            f"matmul_fraction: training FLOP/s / measured {peak.dtype} matmul FLOP/s",
            achieved / 1e9,
            matmul / 1e9,
            achieved / matmul,
            0.60,
        )
    )
    return rows


def format_batch_ratios(batches, ours_seconds, peer_seconds):
    """The keras_hub_per_batch row's batches grouped by shape, one line each: the peer's time over ours.

    >>> import numpy as np
    >>> batch = ({"source_ids": np.zeros((2, 5)), "target_ids": np.zeros((2, 4))}, None)
    >>> print(format_batch_ratios([batch, batch], [1.0, 1.0], [1.5, 2.5]))
    keras_hub_per_batch by batch shape (sentences x target length: batches, peer/ours)
      2x4: 2, 2.00
    """
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for (inputs, _), ours, peer in zip(batches, ours_seconds, peer_seconds):
        group = groups[tuple(inputs["target_ids"].shape)]
        group[0] += 1
        group[1] += ours
        group[2] += peer
    lines = ["keras_hub_per_batch by batch shape (sentences x target length: batches, peer/ours)"]
    for (sentences, length), (count, ours, peer) in sorted(
        groups.items(), key=lambda item: item[0][1]
    ):
        lines.append(f"  {sentences}x{length}: {count}, {peer / ours:.2f}")
    return "\n".join(lines)


# The saved_model row's time budget for the 1,000 Multi30k test sentences through the SavedModel.
SAVED_MODEL_SECONDS = 8.0


def decoding_rows(
    model_dir,
    sources,
    decode_sentences=128,
    saved_model_sentences=None,
    baseline_saved_model=None,
    rounds=3,
):
    """The decoding rows: cached vs recompute beam 4, and the SavedModel translating `sources` (seconds).

    Args:
        model_dir: a trained run directory.
        sources: source sentences (the test split).
        decode_sentences: the first this many are decoded cached and recomputed.
        saved_model_sentences: the SavedModel translates only this many (default: all).
        baseline_saved_model: another text-in/text-out export (e.g. the same run exported
            by an earlier version): the two translate the same sentences in turn, `rounds`
            times, each keeping its fastest pass, and a row gives their ratio. Without it
            the SavedModel makes one timed pass.
        rounds: the alternating passes with a baseline.
    """
    from keras_transformer.decoding.translator import SavedModelTranslator
    from keras_transformer.export import TranslationModule, export_saved_model

    model, tokenizer, config = load_run(model_dir)
    beam = SearchOptions.from_config(
        config, "beam"
    )  # the run's settings (paper: beam 4, alpha 0.6, offset 50)
    rows = []
    # Graph mode drops finished sentences from the working set; XLA keeps static shapes, so
    # there the recompute baseline re-runs the decoder over its whole output buffer.
    for jit_compile, mode in ((False, "graph"), (True, "XLA")):
        cached, recompute = benchmark_decoding(
            model,
            tokenizer,
            sources[:decode_sentences],
            methods=("beam",),
            jit_compile=jit_compile,
            **beam.kwargs(),
        )
        rows.append(
            Row(
                f"cached_search_{mode.lower()}: beam {beam.beam_size} sentences/s, cached vs recompute",
                cached.sentences_per_second,
                recompute.sentences_per_second,
                recompute.seconds / cached.seconds,
                10.0,
            )
        )
    sources = sources[:saved_model_sentences] if saved_model_sentences else sources
    with tempfile.TemporaryDirectory() as export_dir:
        result = export_saved_model(
            TranslationModule(model, tokenizer, **beam.kwargs()),
            export_dir,
            name="benchmark",
            verify=False,
            check_ops=False,
        )
        engines = {"ours": SavedModelTranslator(str(result.path), batch_size=64)}
        if baseline_saved_model:
            engines["baseline"] = SavedModelTranslator(baseline_saved_model, batch_size=64)
        for translate in engines.values():
            translate(sources[:64])  # warm-up (the first call loads the graph)
        workloads = {
            name: functools.partial(translate, sources) for name, translate in engines.items()
        }
        timed = fastest_of_alternating(workloads, rounds if baseline_saved_model else 1)
    seconds, (translations, _) = timed["ours"]
    # Inverted so that "ratio >= target" reads as "within the time budget".
    rows.append(
        Row(
            f"saved_model: {len(sources)} test sentences, beam {beam.beam_size} (s)",
            seconds,
            SAVED_MODEL_SECONDS,
            SAVED_MODEL_SECONDS / seconds,
            1.0,
        )
    )
    if baseline_saved_model:
        baseline_seconds, (baseline_translations, _) = timed["baseline"]
        same = sum(ours == theirs for ours, theirs in zip(translations, baseline_translations))
        rows.append(
            Row(
                f"saved_model_vs_baseline: seconds, same outputs {same}/{len(sources)}",
                seconds,
                baseline_seconds,
                baseline_seconds / seconds,
                None,
            )
        )
    return rows


def _variables_mib(saved_model_dir):
    """The size of a SavedModel's variables (its weights), in MiB."""
    variables = Path(saved_model_dir) / "variables"
    return sum(path.stat().st_size for path in variables.iterdir()) / 2**20


def ctranslate2_rows(
    model_dir,
    pairs,
    beam_size=None,
    length_penalty=None,
    threads=2,
    batch_sizes=(16, 32, 64, 128),
    sweep_sentences=256,
    rounds=3,
    tokenize="13a",
    vocabulary_map=None,
    log=print,
):
    """The ctranslate2 rows: the same weights and sentences decoded five ways, timed alternately in one run.

    Every engine takes text and returns text, so every time includes tokenizing and
    detokenizing: our exported SavedModel, in float32 and with its weights quantized by
    Keras' `model.quantize("int8")` (what `export.py --quantization=int8` exports), our
    in-process `decoding.Translator` (graph mode), and CTranslate2 float32 and int8 exports
    of the run (`export.ctranslate2`; CTranslate2 calls hold sources of one length, so its
    length limits equal ours). Each engine gets the batch size that is fastest for it: every size
    in `batch_sizes` is timed on the first `sweep_sentences` sentences (the curve is
    logged). Then all sentences are translated `rounds` times, the engines alternating
    within each round, and each engine keeps its fastest round. The length penalty is each
    engine's own at the same alpha: GNMT ((5 + |Y|) / 6)^alpha for ours, |Y|^alpha for
    CTranslate2 (docs/ctranslate2.md). Set TensorFlow's thread pools to `threads` before
    TensorFlow starts (experiments/benchmark.py does); CTranslate2 gets `intra_threads`.

    Args:
        model_dir: a trained run directory.
        pairs: `(source, reference)` pairs (the test split).
        beam_size, length_penalty: the search (None: the run config's, `SearchOptions.from_config`);
            every engine also takes the config's `max_output_offset`.
        threads: CTranslate2's intra-op threads.
        batch_sizes: candidate sentences per batch, for every engine.
        sweep_sentences: sentences of the batch-size sweep.
        rounds: timed passes over all sentences per engine, alternating.
        tokenize: sacreBLEU tokenizer of the BLEU column.
        vocabulary_map: None, or a `decoding.shortlist.VocabularyMap`: three more engines
            search over its per-batch shortlist (an approximation, hence the BLEU column):
            our SavedModel, and CTranslate2 float32 and int8 with the same map (`use_vmap`).
        log: prints the sweep and the per-engine table (batch size, sentences/s, target tokens/s, BLEU).

    Returns:
        `Row`s of sentences/s, each engine against CTranslate2 float32 (target 1.0 for the
        SavedModel), the SavedModel against CTranslate2 int8 (target 1.0: our fastest
        export against theirs), and each int8 engine against its float32 one and the
        other's int8 (the same precision on both sides); with a map, also the shortlisted SavedModel against CTranslate2
        float32 and int8 with the map. Target tokens are the output's SentencePiece pieces plus EOS, counted
        the same way for every engine from its output text.
    """
    import ctranslate2

    from keras_transformer.decoding.translator import (
        SavedModelTranslator,
        Translator,
        translate_in_batches,
    )
    from keras_transformer.evaluation.bleu import corpus_bleu
    from keras_transformer.export import TranslationModule, export_saved_model
    from keras_transformer.export.ctranslate2 import export_ctranslate2, translate_ctranslate2

    model, tokenizer, config = load_run(model_dir)
    search = SearchOptions.from_config(
        config, "beam", beam_size=beam_size, length_penalty=length_penalty
    ).kwargs()
    beam_size, length_penalty = search["beam_size"], search["length_penalty"]
    sources, references = [source for source, _ in pairs], [reference for _, reference in pairs]

    def detokenize(outputs):
        return [tokenizer.detokenize([list(ids)]).numpy()[0].decode("utf-8") for ids in outputs]

    def batched(translate_batch):  # an engine: texts, batch size -> translations
        return lambda texts, size: translate_in_batches(translate_batch, texts, size)[0]

    with tempfile.TemporaryDirectory() as workdir:

        def saved_model(exported_model, name, **options):
            """`exported_model`'s search exported under `workdir` (the timing's copy: no verification or
            op check): the SavedModel's directory and its engine."""
            path = export_saved_model(
                TranslationModule(exported_model, tokenizer, **search, **options),
                workdir,
                name=name,
                verify=False,
                check_ops=False,
            ).path
            return path, batched(SavedModelTranslator(str(path)).translate_batch)

        float32_path, float32_engine = saved_model(model, "benchmark")
        int8_path, int8_engine = saved_model(load_run(model_dir, quantization="int8")[0], "int8")
        log(
            f"ctranslate2: SavedModel variables {_variables_mib(float32_path):.2f} MiB, "
            f"int8 (model.quantize('int8')) {_variables_mib(int8_path):.2f} MiB"
        )
        engines = {
            "SavedModel": float32_engine,
            INT8_ENGINE: int8_engine,
            "in-process search": batched(
                Translator(model, tokenizer, "beam", **search).translate_batch
            ),
        }
        if vocabulary_map is not None:
            _, engines[SHORTLIST_ENGINE] = saved_model(
                model, "shortlist", vocabulary_map=vocabulary_map
            )
        for quantization in ("float32", "int8"):
            path = export_ctranslate2(
                model_dir,
                f"{workdir}/ct2_{quantization}",
                quantization=quantization,
                vocabulary_map=vocabulary_map,
            )
            translator = ctranslate2.Translator(
                str(path), device="cpu", inter_threads=1, intra_threads=threads
            )
            for use_vmap in (False, True) if vocabulary_map is not None else (False,):
                engines[f"CTranslate2 {quantization}" + (VMAP_SUFFIX if use_vmap else "")] = (
                    lambda texts, size, translator=translator, use_vmap=use_vmap: detokenize(
                        translate_ctranslate2(
                            translator,
                            tokenizer,
                            texts,
                            **search,
                            max_source_length=config.max_length,
                            max_batch_size=size,
                            use_vmap=use_vmap,
                        )[0]
                    )
                )

        sweep = sources[:sweep_sentences]
        for translate in engines.values():
            translate(sweep[: max(batch_sizes)], max(batch_sizes))  # warm-up: loads and traces
        curve = {engine: {} for engine in engines}
        for size in batch_sizes:
            timed = fastest_of_alternating(
                {
                    engine: functools.partial(translate, sweep, size)
                    for engine, translate in engines.items()
                },
                rounds=1,
            )
            for engine, (seconds, _) in timed.items():
                curve[engine][size] = len(sweep) / seconds
        chosen = {engine: max(rates, key=rates.get) for engine, rates in curve.items()}
        log(f"ctranslate2: batch-size sweep on {len(sweep)} sentences (sentences/s):")
        log(f"   {'engine':26s} " + " ".join(f"{size:>8d}" for size in batch_sizes))
        for engine, rates in curve.items():
            log(f"   {engine:26s} " + " ".join(f"{rates[size]:8.1f}" for size in batch_sizes))

        fastest = fastest_of_alternating(
            {
                engine: functools.partial(translate, sources, chosen[engine])
                for engine, translate in engines.items()
            },
            rounds,
        )

    log(
        f"ctranslate2: {len(sources)} sentences, beam {beam_size}, alpha {length_penalty} (each engine's own length penalty), "
        f"fastest of {rounds} alternating rounds, CTranslate2 intra_threads={threads}"
    )
    log(f"   {'engine':26s} {'batch':>6s} {'sentences/s':>12s} {'tokens/s':>10s} {'BLEU':>7s}")
    rates = {}
    for engine, (seconds, translations) in fastest.items():
        tokens = sum(len(ids) + 1 for ids in tokenizer.tokenize(translations).to_list())
        bleu = corpus_bleu(translations, references, tokenize=tokenize)[0]
        rates[engine] = len(sources) / seconds
        log(
            f"   {engine:26s} {chosen[engine]:6d} {rates[engine]:12.2f} {tokens / seconds:10.1f} {bleu:7.2f}"
        )
    base = rates["CTranslate2 float32"]
    rows = [
        Row(
            "ctranslate2_float32: SavedModel vs CTranslate2 float32, sentences/s",
            rates["SavedModel"],
            base,
            rates["SavedModel"] / base,
            1.0,
        ),
        Row(
            "ctranslate2_in_process: in-process search vs CTranslate2 float32",
            rates["in-process search"],
            base,
            rates["in-process search"] / base,
            None,
        ),
        Row(
            "ctranslate2_int8_gain: CTranslate2 int8 vs float32, sentences/s",
            rates["CTranslate2 int8"],
            base,
            rates["CTranslate2 int8"] / base,
            None,
        ),
        Row(
            "ctranslate2_int8: SavedModel vs CTranslate2 int8, sentences/s",
            rates["SavedModel"],
            rates["CTranslate2 int8"],
            rates["SavedModel"] / rates["CTranslate2 int8"],
            1.0,
        ),
        Row(
            "savedmodel_int8_gain: SavedModel int8 vs float32, sentences/s",
            rates[INT8_ENGINE],
            rates["SavedModel"],
            rates[INT8_ENGINE] / rates["SavedModel"],
            None,
        ),
        Row(
            "ctranslate2_int8_both: SavedModel int8 vs CTranslate2 int8",
            rates[INT8_ENGINE],
            rates["CTranslate2 int8"],
            rates[INT8_ENGINE] / rates["CTranslate2 int8"],
            None,
        ),
    ]
    if vocabulary_map is not None:
        for quantization in ("float32", "int8"):
            theirs = rates[f"CTranslate2 {quantization}{VMAP_SUFFIX}"]
            rows.append(
                Row(
                    f"ctranslate2_{quantization}_vmap: shortlisted SavedModel vs CT2 + vmap",
                    rates[SHORTLIST_ENGINE],
                    theirs,
                    rates[SHORTLIST_ENGINE] / theirs,
                    None,
                )
            )
    return rows
