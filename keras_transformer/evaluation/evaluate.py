"""Evaluate a trained run, or an exported SavedModel, on a corpus split with sacreBLEU."""

import dataclasses
import time

from keras_transformer import fs, runs
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.decoding.translator import SavedModelTranslator, Translator
from keras_transformer.evaluation.bleu import score_corpus


def default_tokenize(dataset):
    """sacreBLEU's tokenizer for a dataset: "char" for the built-in task, else "13a".

    The built-in task's German side is one compound word per sentence, on which word
    BLEU is always 0; character BLEU (`tok:char` in the signature) measures it.
    """
    return "char" if dataset == "builtin" else "13a"


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    """What an evaluation measured.

    Attributes:
        scores: a `CorpusScores` (BLEU, chrF and their sacreBLEU signatures).
        sources, hypotheses, references: the evaluated sentences, in corpus order.
        seconds: wall time spent translating.
        settings: the decoding settings used (method, beam size, ...).
    """

    scores: object
    sources: list
    hypotheses: list
    references: list
    seconds: float
    settings: dict

    @property
    def sentences_per_second(self):
        return len(self.hypotheses) / self.seconds if self.seconds > 0 else float("nan")


def write_lines(path, lines):
    """Write one line per item (newlines inside an item become spaces), UTF-8, atomically (any `fs` path)."""
    return fs.write_text(path, "".join(" ".join(line.splitlines()) + "\n" for line in lines))


def evaluate_translator(
    translate, pairs, lowercase=False, tokenize="13a", output=None, settings=None, progress=None
):
    """Translate the sources of `pairs` with `translate` and score them against the targets.

    Args:
        translate: a function of a list of strings returning `(translations, scores)`,
            e.g. a `Translator` or `SavedModelTranslator`.
        pairs: `(source, reference)` pairs.
        lowercase, tokenize: sacreBLEU options (see `evaluation.corpus_bleu`).
        output: if given, write the hypotheses there, one line each, in corpus order.
        settings: recorded in the result.
        progress: optional `progress(done, total)`, passed on to `translate` (which then
            takes it as a keyword, as both translators do) to be called after every batch.

    Returns:
        an `EvaluationResult`.
    """
    pairs = list(pairs)
    if not pairs:
        raise ValueError("No sentence pairs to evaluate")
    sources = [source for source, _ in pairs]
    references = [reference for _, reference in pairs]
    start = time.perf_counter()
    hypotheses, _ = (
        translate(sources) if progress is None else translate(sources, progress=progress)
    )
    seconds = time.perf_counter() - start
    if output:
        write_lines(output, hypotheses)
    scores = score_corpus(hypotheses, references, lowercase=lowercase, tokenize=tokenize)
    return EvaluationResult(scores, sources, hypotheses, references, seconds, dict(settings or {}))


def _load_split(dataset, split, src_lang, tgt_lang, data_dir, files, max_sentences):
    from keras_transformer.data.sources import load_pairs

    pairs = load_pairs(dataset, split, src_lang, tgt_lang, data_dir, files)
    return pairs[:max_sentences] if max_sentences else pairs


def evaluate_run(
    model_dir,
    dataset="builtin",
    split="test",
    src_lang="en",
    tgt_lang="de",
    data_dir=None,
    files=None,
    method="beam",
    beam_size=None,
    length_penalty=None,
    max_output_offset=None,
    checkpoint=None,
    average_last=None,
    ensemble=(),
    batch_size=64,
    max_sentences=None,
    lowercase=False,
    tokenize=None,
    output=None,
    pairs=None,
    progress=None,
    **search_options,
):
    """Translate a corpus split with a trained run and score it with sacreBLEU.

    Args:
        model_dir: a run directory (see `training.load_run`).
        dataset, split, src_lang, tgt_lang, data_dir, files: the corpus
            (see `data.sources.load_pairs`).
        method: "beam" (default), "greedy" or "sample".
        beam_size, length_penalty, max_output_offset: search settings; `None` takes the
            run config's values (paper: beam 4, alpha 0.6, input length + 50).
        checkpoint: a checkpoint prefix (default: the latest).
        average_last: average the last this many checkpoints instead.
        ensemble: more run directories trained with `model_dir`'s tokenizer, which
            search with it as one (`runs.load_ensemble`; `average_last` applies to each).
        batch_size: sentences decoded together (grouped by length).
        max_sentences: evaluate only the first this many pairs.
        lowercase, tokenize: sacreBLEU options; `tokenize=None` is `default_tokenize(dataset)`
            ("char" for the built-in task, else "13a").
        output: write the hypotheses to this file, one line each.
        pairs: evaluate these `(source, reference)` pairs instead of loading a split.
        progress: optional `progress(done, total)`, called after every batch.
        **search_options: further search arguments (`temperature`, `top_k`, `top_p`,
            `seed` for sampling, `max_length`, ...).

    Returns:
        an `EvaluationResult`.

    Example:

    >>> result = evaluate_run("runs/builtin_tiny", split="test", max_sentences=100)
    >>> print(result.scores.format())  # BLEU = 97.12 ... once trained for longer
    BLEU = ... nrefs:1|case:mixed|eff:no|tok:char|smooth:exp|version:...
    chrF2 = ... nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:...
    >>> len(result.hypotheses), result.settings["method"], result.settings["beam_size"]
    (100, 'beam', 4)
    """
    model, tokenizer, config = runs.load_ensemble([model_dir, *ensemble], checkpoint, average_last)
    options = SearchOptions.from_config(
        config,
        method,
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_output_offset=max_output_offset,
        **search_options,
    ).kwargs()
    if pairs is None:
        pairs = _load_split(dataset, split, src_lang, tgt_lang, data_dir, files, max_sentences)
    elif max_sentences:
        pairs = list(pairs)[:max_sentences]
    translator = Translator(model, tokenizer, method, batch_size=batch_size, **options)
    tokenize = tokenize or default_tokenize(dataset)
    settings = {
        "model_dir": str(model_dir),
        "dataset": dataset,
        "split": split,
        "method": method,
        **options,
    }
    if ensemble:
        settings["ensemble"] = ",".join(map(str, ensemble))
    return evaluate_translator(translator, pairs, lowercase, tokenize, output, settings, progress)


def evaluate_saved_model(
    export_dir,
    pairs,
    batch_size=64,
    signature="serving_default",
    lowercase=False,
    tokenize="13a",
    output=None,
    progress=None,
):
    """Translate `(source, reference)` pairs with an exported SavedModel and score them.

    The SavedModel's signature takes the input key `text` (a string batch) and returns
    `translation` and `score` (see `SavedModelTranslator`); its decoding settings are
    those fixed at export time. `export_dir` is a SavedModel directory, or a model root
    (`saved_models/<name>`: its highest version). `progress(done, total)`, if given, is
    called after every batch.

    Returns:
        an `EvaluationResult`.

    Example:

    >>> from keras_transformer.data.sources import load_pairs
    >>> result = evaluate_saved_model("saved_models/numbers/1",
    ...                               load_pairs("builtin", "test")[:100], tokenize="char")
    >>> len(result.hypotheses), result.settings
    (100, {'saved_model': 'saved_models/numbers/1', 'signature': 'serving_default'})
    """
    translator = SavedModelTranslator(export_dir, batch_size=batch_size, signature=signature)
    settings = {"saved_model": translator.export_dir, "signature": signature}
    return evaluate_translator(translator, pairs, lowercase, tokenize, output, settings, progress)


@dataclasses.dataclass(frozen=True)
class CheckpointScore:
    """The scores of one checkpoint of a run.

    Attributes:
        step: the training step the checkpoint was written at.
        wall_time: when it was written (seconds since the epoch).
        path: the checkpoint prefix.
        scores: a `CorpusScores`.
    """

    step: int
    wall_time: float
    path: str
    scores: object


def score_checkpoints(
    model_dir,
    pairs,
    method="greedy",
    batch_size=64,
    lowercase=False,
    tokenize="13a",
    every=1,
    average_last=None,
    ensemble=(),
    **search_options,
):
    """Translate `pairs` with every kept checkpoint of a run and score each with sacreBLEU.

    The model and the compiled search are built once; each checkpoint's weights are read
    into them in turn. Wall times are the save times the checkpoint manager recorded, so
    scores can be plotted against training time (see `write_scalar_events`).

    With `average_last` and `ensemble`, each point is what `evaluate_run` would score had
    the runs stopped at that step: every run's last `average_last` checkpoints up to the
    step, averaged, and the runs searching as one (`runs.load_ensemble`). Steps with fewer
    than `average_last` checkpoints before them are left out; the wall time of a point is
    the latest save time among the checkpoints it reads.

    Args:
        model_dir: a run directory.
        pairs: `(source, reference)` pairs, e.g. the validation split.
        method: search method (greedy is the cheap choice for tracking progress).
        batch_size: sentences decoded together.
        lowercase, tokenize: sacreBLEU options.
        every: score only every this-many-th checkpoint (the latest is always scored).
        average_last: at each step, average the run's last this many checkpoints up to it.
        ensemble: more run directories (the same tokenizer) that search with it, each at
            its own checkpoints up to the step.
        **search_options: further search settings (`beam_size`, `length_penalty`, ...);
            unset ones come from the run config.

    Returns:
        a list of `CheckpointScore`, oldest first (`path`: `model_dir`'s checkpoint).

    Raises:
        ValueError: a run of `ensemble` has no checkpoint (or fewer than `average_last`)
            up to a scored step, naming the run and the step.
    """
    run_dirs = [model_dir, *ensemble]
    averaged = average_last or 1
    runs.checkpoint_paths(
        runs.checkpoint_dir(model_dir), last=averaged
    )  # raises when there are fewer
    paths = runs.checkpoint_paths(runs.checkpoint_dir(model_dir))
    chosen = [i for i in range(averaged - 1, len(paths)) if i % every == (len(paths) - 1) % every]
    model, tokenizer, config = runs.load_ensemble(run_dirs, checkpoint=paths[chosen[0]])
    members = model.models if len(run_dirs) > 1 else (model,)
    options = SearchOptions.from_config(config, method, **search_options).kwargs()
    translator = Translator(model, tokenizer, method, batch_size=batch_size, **options)
    pairs = list(pairs)
    sources = [source for source, _ in pairs]
    references = [reference for _, reference in pairs]
    saved = {}  # checkpoint prefix -> save time, of every run
    for run_dir in run_dirs:
        kept = runs.checkpoint_paths(runs.checkpoint_dir(run_dir))
        saved.update(zip(kept, runs.checkpoint_times(runs.checkpoint_dir(run_dir), kept)))
    results = []
    for i in chosen:
        step, newest = runs.checkpoint_step(paths[i]), []
        for member, run_dir in zip(members, run_dirs):
            read = runs.checkpoint_paths(
                runs.checkpoint_dir(run_dir), last=averaged, until_step=step
            )
            if average_last:
                runs.average_checkpoints(member, read)
            else:
                runs.read_model_weights(member, read[-1])
            newest.append(saved[read[-1]])
        hypotheses, _ = translator(sources)
        scores = score_corpus(hypotheses, references, lowercase=lowercase, tokenize=tokenize)
        results.append(CheckpointScore(step, max(newest), paths[i], scores))
    return results
