"""Train a translation model end to end: corpus -> tokenizer -> pipeline -> Trainer.

Everything a run needs later (decoding, evaluation, export) is written into its directory
(layout: `keras_transformer.runs`).
"""

import dataclasses
import hashlib
import json
import time

import keras
import tensorflow as tf
from absl import logging

from keras_transformer import fs
from keras_transformer.backends import require_tensorflow
from keras_transformer.data.pipeline import check_bucket_boundaries, make_dataset, padding_fraction
from keras_transformer.data.plan import BatchPlan
from keras_transformer.data.sources import load_pairs, whole_words
from keras_transformer.data.tokenizer import Tokenizer, check_sampling_alpha, train_sentencepiece
from keras_transformer.models.config import TransformerConfig
from keras_transformer.runs import (
    UnreadableCheckpointError,
    config_path,
    flags_path,
    has_marian_tokenizer,
    latest_checkpoint,
    log_dir,
    read_run_config,
    record_start,
    run_tokenizer,
    tokenizer_files,
    tokenizer_path,
    worker_dir,
    write_flag_file,
)
from keras_transformer.runs import write_run_config as write_run_payload
from keras_transformer.training.lease import DEFAULT_LEASE_TIMEOUT, RunLease
from keras_transformer.training.options import TrainOptions
from keras_transformer.training.progress import TerminationSignal
from keras_transformer.training.schedule import paper_optimizer
from keras_transformer.training.strategy import is_chief
from keras_transformer.training.trainer import Trainer, write_run_config

DEFAULT_TOKENIZER_WAIT = 7200.0
"""Seconds a non-chief worker waits for the chief's tokenizer (`--tokenizer_wait`): SentencePiece
trains on every sentence of the corpus, which for WMT14 (about 9 million sentences) takes the
chief a long time."""


def prepare_tokenizer(
    model_dir,
    pairs,
    vocabulary_size,
    seed=0,
    chief=True,
    timeout=DEFAULT_TOKENIZER_WAIT,
    whole_words=(),
    model_type="unigram",
):
    """Load the run's SentencePiece model, or train a joint one (`model_type`: "unigram" or
    "bpe") on `pairs` and save it there.

    Only the chief trains; other workers of a multi-worker run wait up to `timeout` seconds
    for its file (then `TimeoutError`, one line). A run that holds a Marian tokenizer pair (an
    imported model, `runs.run_tokenizer`) keeps it: nothing is trained.
    """
    if has_marian_tokenizer(model_dir):
        return run_tokenizer(model_dir)
    path = tokenizer_path(model_dir)
    if not chief:
        deadline = time.time() + timeout
        while not fs.exists(path):
            if time.time() > deadline:
                raise TimeoutError(
                    f"The chief did not write {path} within {timeout:.0f} s: if it is still training "
                    "the tokenizer, wait longer (--tokenizer_wait)"
                )
            time.sleep(0.5)
    if not fs.exists(path):
        sentences = [text for pair in pairs for text in pair]
        logging.info(
            "Training a %d-piece SentencePiece %s model on %d sentences",
            vocabulary_size,
            model_type,
            len(sentences),
        )
        train_sentencepiece(
            sentences,
            path,
            vocabulary_size,
            model_type=model_type,
            seed=seed,
            whole_words=whole_words,
        )
    return Tokenizer(path)


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """Which corpus to train on (see `data.sources.load_pairs`)."""

    dataset: str = "builtin"
    src_lang: str = "en"
    tgt_lang: str = "de"
    data_dir: str = None
    files: dict = None
    max_length: int = None  # defaults to the model's max_length
    bucket_boundaries: tuple = (
        None  # padded lengths (default: data.pipeline.default_bucket_boundaries)
    )
    sampling_alpha: float = None  # subword regularization of the training data (Tokenizer.sampler)

    def __post_init__(self):
        if self.sampling_alpha is not None:
            check_sampling_alpha(self.sampling_alpha)


# The settings a run's data position is planned with (`data.BatchPlan`): a resume that
# changes one of them would continue at another place in the data, so it is refused.
# Replicas, devices and `accum_steps` may change: the position counts global batches of
# one plan, whatever takes them.
POSITION_SETTINGS = {
    "training": ("batch_tokens", "seed"),
    "data": (
        "dataset",
        "src_lang",
        "tgt_lang",
        "data_dir",
        "files",
        "max_length",
        "bucket_boundaries",
        "sampling_alpha",
    ),
}


def check_checkpoint_settings(model_dir, payload):
    """Raise a one-line `ValueError` if `payload` changes a training setting that changes what the run's
    checkpoints hold: the precision, when the optimizer it builds differs (`mixed_float16` wraps it in a
    `LossScaleOptimizer`, whose loss scale is checkpointed)."""
    _, first = read_run_config(model_dir)
    before, now = first.get("training", {}).get("precision"), payload["training"]["precision"]
    if before is None or before == now:
        return
    hidden_dim = payload["model"]["hidden_dim"]
    kinds = [
        type(paper_optimizer(hidden_dim, precision=precision)).__name__
        for precision in (before, now)
    ]
    if kinds[0] != kinds[1]:
        raise ValueError(
            f"{model_dir} was started with precision={before!r}, now precision={now!r}: its checkpoints hold an "
            f"optimizer of type {kinds[0]}, this start would build one of type {kinds[1]}. Resume with "
            f"precision={before!r}, or start a new model_dir."
        )


def check_resume_settings(model_dir, payload):
    """Raise a one-line `ValueError` if `payload` changes a setting the run's data position depends on.

    `payload` is this start's run config (`{"model", "training", "data"}`); the run's first
    config is in `config.json`.
    """
    _, first = read_run_config(model_dir)
    for section, names in POSITION_SETTINGS.items():
        for name in names:
            if section not in first or name not in first[section]:
                continue
            before, now = first[section][name], json.loads(json.dumps(payload[section][name]))
            if before != now:
                raise ValueError(
                    f"{model_dir} was started with {name}={before!r}, now {name}={now!r}: its data position "
                    f"(in checkpoints) counts batches planned with the first value. Resume with {name}={before!r}, "
                    "or start a new model_dir."
                )


FINGERPRINT = "data_fingerprint"  # the section of config.json (and of each start in starts.jsonl)
FINGERPRINT_SPLITS = ("train", "val")
_SIDES = ("source", "target")


def data_fingerprint(data: DataOptions, pairs):
    """What the run reads of each split: `{split: {"examples": n, "source": {"file": name,
    "sha256": hex}, "target": {...}}}`.

    The hash covers the sentences as loaded (UTF-8, one per line), so it sees any change
    to their text or order whatever the file format; it is computed from the pairs already
    in memory, streamed in chunks. `name` is the file given (`--dataset=files`), else the
    corpus, split and language.

    Args:
        data: the run's `DataOptions`.
        pairs: `{split: [(source, target), ...]}` for `FINGERPRINT_SPLITS`.
    """
    fingerprint = {}
    for split, split_pairs in pairs.items():
        entry = {"examples": len(split_pairs)}
        for index, side in enumerate(_SIDES):
            digest = hashlib.sha256()
            for start in range(0, len(split_pairs), 65536):
                chunk = split_pairs[start : start + 65536]
                digest.update("".join(f"{pair[index]}\n" for pair in chunk).encode("utf-8"))
            entry[side] = {"file": _corpus_file(data, split, index), "sha256": digest.hexdigest()}
        fingerprint[split] = entry
    return fingerprint


def _corpus_file(data, split, index):
    if data.dataset == "files":
        return str(data.files[split][index])
    side = (
        (data.src_lang, data.tgt_lang)[index]
        if data.dataset in ("multi30k", "wmt14")
        else _SIDES[index]
    )
    where = f" in {data.data_dir}" if data.data_dir else ""
    return f"the {data.dataset} {split} {side} sentences{where}"


def changed_data(recorded, fingerprint):
    """One phrase per corpus file whose example count or contents differ from `recorded` (a
    `data_fingerprint`), naming it; splits `recorded` lacks are not compared."""
    changes = []
    for split, now in fingerprint.items():
        before = recorded.get(split)
        if before is None:
            continue
        for side in _SIDES:
            if (
                before["examples"] != now["examples"]
                or before[side]["sha256"] != now[side]["sha256"]
            ):
                changes.append(
                    f"{now[side]['file']} ({before['examples']} examples, sha256 {before[side]['sha256'][:12]} when "
                    f"recorded; now {now['examples']}, {now[side]['sha256'][:12]})"
                )
    return changes


def check_data_unchanged(model_dir, fingerprint, allow_changed=False):
    """Refuse to resume on data other than the run's (`config.json`'s `data_fingerprint`).

    Returns:
        whether the recorded fingerprint must be (re)written: the run has none yet (an older
        run), or a change was accepted (`allow_changed`, with a warning).

    Raises:
        ValueError: one line naming the first changed file (without `allow_changed`).
    """
    _, recorded = read_run_config(model_dir)
    if FINGERPRINT not in recorded:
        return True
    changes = changed_data(recorded[FINGERPRINT], fingerprint)
    if not changes:
        return False
    if not allow_changed:
        raise ValueError(
            f"{changes[0]} changed since {model_dir} recorded it{f' (and {len(changes) - 1} more)' if len(changes) > 1 else ''}: "
            "its checkpoints' input position counts examples of the recorded data. Restore that data, start a new "
            "model_dir, or accept the change with --allow_changed_data."
        )
    logging.warning(
        "Resuming %s on changed data, as --allow_changed_data asks: %s; the input continues at the same "
        "position in the new data",
        model_dir,
        "; ".join(changes),
    )
    return True


def check_workers_agree(strategy, fingerprint):
    """Every worker of a multi-worker run reads the same data: their fingerprints are gathered
    (one collective) and compared with the first worker's, so every worker reaches the same
    verdict and none is left waiting for the others.

    Raises:
        ValueError: one line naming a worker and the file it reads differently.
    """
    workers = _cluster_workers(strategy)
    if workers < 2:
        return
    entries = [(split, side) for split in sorted(fingerprint) for side in _SIDES]
    row = [
        int.from_bytes(bytes.fromhex(fingerprint[split][side]["sha256"])[:8], "big", signed=True)
        for split, side in entries
    ] + [fingerprint[split]["examples"] for split in sorted(fingerprint)]
    local = tf.constant([row], tf.int64)
    gathered = strategy.gather(strategy.run(lambda: tf.identity(local)), axis=0).numpy()
    per_worker = max(len(gathered) // workers, 1)
    for replica in range(len(gathered)):
        differs = [
            index for index in range(len(row)) if gathered[replica][index] != gathered[0][index]
        ]
        if differs:
            index = (
                differs[0]
                if differs[0] < len(entries)
                else (differs[0] - len(entries)) * len(_SIDES)
            )
            split, side = entries[index]
            raise ValueError(
                f"Worker {replica // per_worker} reads different data than worker 0: {fingerprint[split][side]['file']} "
                "(its example count or contents differ). Every worker must read the same copy of the corpus."
            )


def _cluster_workers(strategy):
    """The number of workers of a `MultiWorkerMirroredStrategy` cluster (1 for any other strategy)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 1
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return sum(len(spec.get(kind, ())) for kind in ("chief", "worker"))


def train_translation(
    config: TransformerConfig,
    model_dir,
    options: TrainOptions,
    data: DataOptions,
    strategy=None,
    termination=None,
    allow_changed_data=False,
    tokenizer_wait=DEFAULT_TOKENIZER_WAIT,
    lease_timeout=DEFAULT_LEASE_TIMEOUT,
    callbacks=None,
    flag_file=None,
):
    """Train (or resume) a translation run in `model_dir`.

    A run directory that already holds a config must have the same architecture
    (`TransformerConfig.architecture`) and the same data position settings
    (`POSITION_SETTINGS`); training settings such as `train_steps`, `accum_steps`, the
    number of replicas or the precision may change, but not from or to `mixed_float16`
    (`check_checkpoint_settings`: its optimizer holds a loss scale). The first start's config
    stays in `config.json`; every start's settings, and the step it restored, are appended to
    `starts.jsonl`. The tokenizer is reused; training continues from the newest readable
    checkpoint (`Trainer.restore`), and its input at the same
    example (`data.BatchPlan`; with `sampling_alpha`, whose segmentations are drawn
    anew, the input is replayed instead).

    The data is fingerprinted (`data_fingerprint`: each split's example count and a hash of
    each side), recorded in `config.json` and compared on every resume
    (`check_data_unchanged`) and, at every start, across the workers of a multi-worker run
    (`check_workers_agree`).

    Every worker checks that it can write into `model_dir` before reading the corpus. The
    chief takes the run's lease (`training.lease`: a second live process on the same
    directory is refused) and removes `.worker_<i>` directories a worker killed mid-save
    left behind.

    SIGTERM during start-up (reading, tokenizing, planning) returns at the next stage
    with `results["preempted"] = True` and `results["step"] = None`, no checkpoint written; during training, see
    `Trainer.train`.

    Args:
        termination: a `training.progress.TerminationSignal` already watching SIGTERM
            (a script installs one first thing); default: one for this call.
        allow_changed_data: resume although the data differs from the recorded fingerprint
            (warned, and the new fingerprint recorded).
        tokenizer_wait: seconds a non-chief worker waits for the chief's tokenizer.
        lease_timeout: seconds without a heartbeat after which another process may take the
            run's lease over (`training.lease.RunLease`).
        callbacks: Keras callbacks for `Trainer.train`.
        flag_file: the text of an absl flag file that runs this start again
            (`cli.flag_file`, written by `experiments/train.py`): once the start is recorded the
            chief writes it as the run's `flags.txt` (`runs.write_flag_file`: rewritten only
            when it differs), so a start refused (another architecture, a busy directory)
            leaves the run's file alone.

    Returns:
        `(trainer, results)`; results as `Trainer.train`, plus the run's paths. The
        trainer is None when start-up was interrupted.
    """
    require_tensorflow("Training (training.train_translation)")
    start = dict(
        allow_changed_data=allow_changed_data,
        tokenizer_wait=tokenizer_wait,
        lease_timeout=lease_timeout,
        callbacks=callbacks,
        flag_file=flag_file,
    )
    if termination is not None:
        return _train_translation(config, model_dir, options, data, strategy, termination, **start)
    with TerminationSignal() as termination:
        return _train_translation(config, model_dir, options, data, strategy, termination, **start)


def _train_translation(
    config,
    model_dir,
    options,
    data,
    strategy,
    termination,
    allow_changed_data,
    tokenizer_wait,
    lease_timeout,
    callbacks,
    flag_file,
):
    # Seed first: it also clears TensorFlow's kernel caches, which would drop the
    # tokenizer's in-graph resources if they were created before.
    keras.utils.set_random_seed(options.seed)
    model_dir = fs.as_path(model_dir)
    if fs.exists(config_path(model_dir)):
        previous, _ = read_run_config(model_dir)
        before, now = previous.architecture(), config.architecture()
        changed = sorted(name for name in now if before[name] != now[name])
        if changed:
            details = ", ".join(f"{name}: {before[name]!r} -> {now[name]!r}" for name in changed)
            raise ValueError(
                f"{model_dir} holds a run with a different architecture ({details}). "
                "Use a new --model_dir, or the same architecture to resume."
            )
    max_length = data.max_length or config.max_length
    if data.bucket_boundaries is not None:  # before anything is loaded or written
        check_bucket_boundaries(data.bucket_boundaries, max_length)
    payload = {
        "model": config.to_dict(),
        "training": dataclasses.asdict(options),
        "data": dataclasses.asdict(data),
    }
    if fs.exists(config_path(model_dir)):
        check_resume_settings(model_dir, payload)
        check_checkpoint_settings(model_dir, payload)
    strategy = strategy or tf.distribute.get_strategy()
    chief = is_chief(strategy)
    fs.check_writable(model_dir)  # every worker, now, not at its first checkpoint
    if not chief:
        return _start(
            config,
            model_dir,
            options,
            data,
            strategy,
            termination,
            payload,
            None,
            allow_changed_data,
            tokenizer_wait,
            callbacks,
            flag_file,
        )
    with RunLease(model_dir, lease_timeout) as lease:
        lease.start_heartbeat()  # start-up logs nothing for long stretches; the loop renews at logs and saves
        for stale in fs.glob(worker_dir(model_dir, "*")):
            fs.rmtree(stale)
            logging.warning("Removed %s, left by a worker stopped while saving", stale)
        return _start(
            config,
            model_dir,
            options,
            data,
            strategy,
            termination,
            payload,
            lease,
            allow_changed_data,
            tokenizer_wait,
            callbacks,
            flag_file,
        )


def _start(
    config,
    model_dir,
    options,
    data,
    strategy,
    termination,
    payload,
    lease,
    allow_changed_data,
    tokenizer_wait,
    callbacks,
    flag_file,
):
    chief = lease is not None
    max_length = data.max_length or config.max_length
    interrupted = _Interrupted(termination)
    train_pairs = load_pairs(
        data.dataset, "train", data.src_lang, data.tgt_lang, data.data_dir, data.files
    )
    val_pairs = load_pairs(
        data.dataset, "val", data.src_lang, data.tgt_lang, data.data_dir, data.files
    )
    fingerprint = data_fingerprint(data, {"train": train_pairs, "val": val_pairs})
    check_workers_agree(strategy, fingerprint)
    record_fingerprint = (
        check_data_unchanged(model_dir, fingerprint, allow_changed_data)
        if fs.exists(config_path(model_dir))
        else False
    )
    tokenizer = prepare_tokenizer(
        model_dir,
        train_pairs,
        config.vocabulary_size,
        options.seed,
        chief=chief,
        timeout=tokenizer_wait,
        model_type=config.tokenizer_type,
        whole_words=whole_words(data.dataset, train_pairs),
    )

    def batches(pairs, **kwargs):
        return make_dataset(
            pairs,
            tokenizer,
            batch_tokens=options.batch_tokens,
            max_length=max_length,
            bucket_boundaries=data.bucket_boundaries,
            **kwargs,
        )

    try:
        interrupted.check()
        if data.sampling_alpha is None:
            train_input = BatchPlan(
                train_pairs,
                tokenizer,
                batch_tokens=options.batch_tokens,
                max_length=max_length,
                bucket_boundaries=data.bucket_boundaries,
                seed=options.seed,
                interrupted=interrupted,
            )
            padding = padding_fraction(train_input.dataset(0), num_batches=50)
        else:

            def train_input(
                input_context,
            ):  # new segmentations on every pass: not plannable, replayed on resume
                return batches(
                    train_pairs,
                    seed=options.seed,
                    repeat=True,
                    input_context=input_context,
                    sampling_alpha=data.sampling_alpha,
                )

            padding = padding_fraction(
                batches(train_pairs, seed=options.seed, sampling_alpha=data.sampling_alpha),
                num_batches=50,
            )
        interrupted.check()
    except InterruptedError:
        logging.warning(
            "Stopped by SIGTERM during start-up, before any update; no checkpoint was written."
        )
        return None, {"preempted": True, "step": None, "checkpoint": _latest_or_none(model_dir)}
    if chief:
        if not fs.exists(
            config_path(model_dir)
        ):  # the first start's config is kept, but for the data it reads now
            write_run_config(
                model_dir,
                config,
                options,
                {"data": dataclasses.asdict(data), FINGERPRINT: fingerprint},
            )
        elif record_fingerprint:
            write_run_payload(
                model_dir, {**read_run_config(model_dir)[1], FINGERPRINT: fingerprint}
            )
    logging.info("Padding fraction of training batches: %.3f", padding)
    trainer = Trainer(config, model_dir, options, strategy, lease=lease)
    trainer.restore(
        repair=True
    )  # every worker (they compare what they restored); the chief may set damage aside
    if lease is not None:
        lease.stop_heartbeat()
    if termination.received:
        logging.warning(
            "Stopped by SIGTERM during start-up, before any update; no checkpoint was written."
        )
        return None, {
            "preempted": True,
            "step": None,
            "checkpoint": trainer.manager.latest_checkpoint,
        }
    if chief:  # the step restored, not the state file's latest
        record_start(
            model_dir,
            {
                **payload,
                FINGERPRINT: fingerprint,
                "time": time.time(),
                "replicas": strategy.num_replicas_in_sync,
                "step": trainer.step,
            },
        )
        if flag_file is not None:
            _write_flag_file(model_dir, flag_file)
    results = trainer.train(
        train_input,
        batches(val_pairs, shuffle=False),
        padding_fraction=padding,
        termination=termination,
        scorer=_scorer(config, options, data, tokenizer, val_pairs),
        callbacks=callbacks,
    )
    results.update(
        padding_fraction=padding,
        model_dir=str(model_dir),
        checkpoint=trainer.manager.latest_checkpoint,
        tokenizer=str(tokenizer_files(model_dir)[0]),
        logs=str(log_dir(model_dir)),
    )
    return trainer, results


def _write_flag_file(model_dir, text):
    written, previous = write_flag_file(model_dir, text)
    if written and previous is not None:
        before, now = set(previous.splitlines()), set(text.splitlines())
        changes = [f"-{line}" for line in sorted(before - now)] + [
            f"+{line}" for line in sorted(now - before)
        ]
        logging.warning(
            "Flags changed since the previous start (%s); %s now holds this start's.",
            " ".join(changes),
            flags_path(model_dir),
        )


def _scorer(config, options, data, tokenizer, val_pairs):
    """The `evaluation.scoring.TaskScorer` of `options.score_every` (None without it): the first
    `score_sentences` validation pairs, decoded with `score_search` (greedy by default), BLEU and
    chrF (`default_tokenize(dataset)`) or, for `--dataset=ptb`, EVALB's figures."""
    if not options.score_every:
        return None
    from keras_transformer.evaluation.evaluate import default_tokenize
    from keras_transformer.evaluation.scoring import TaskScorer

    return TaskScorer.from_config(
        config,
        tokenizer,
        val_pairs[: options.score_sentences],
        search=options.score_search,
        parsing=data.dataset == "ptb",
        tokenize=default_tokenize(data.dataset),
    )


class _Interrupted:
    """Whether SIGTERM arrived during start-up (checked between its stages and tokenization chunks)."""

    def __init__(self, termination):
        self._termination = termination

    def __call__(self):
        return self._termination.received

    def check(self):
        if self._termination.received:
            raise InterruptedError("SIGTERM during start-up")


def _latest_or_none(model_dir):
    """The state file's latest checkpoint; None also when the state file cannot be read (restore reports that)."""
    try:
        return latest_checkpoint(model_dir)
    except (UnreadableCheckpointError, OSError):
        return None
