"""Speed per Keras backend: training tokens/s and beam-search sentences/s, same model, same batches.

    python experiments/benchmark_backends.py --model_dir=runs/builtin_tiny

The parent process (TensorFlow) writes one work directory (`prepare`): the run's config,
tokenizer and weights, a list of bucketed training batches and length-sorted batches of
source ids. Then, for each of `rounds` rounds, it starts one fresh process per backend
(`KERAS_BACKEND=...`, `python -m keras_transformer.benchmark.backends WORK_DIR OUT`; the
order of the backends rotates from round to round) that loads them and times:

* **training**: `model.fit` with the label-smoothed loss and the paper's optimizer over
  every training batch (one update each, dropout on), after an untimed pass that compiles
  every batch shape; real target tokens (labels that are not PAD) per second, fastest of
  `passes` passes (`prepare`'s, default `PASSES`). On
  TensorFlow `fit` runs `Transformer`'s own steps, on JAX and PyTorch Keras' steps.
* **decoding**: beam search (beam K, alpha, source length + offset) over every source
  batch, after an untimed pass; sentences per second and output tokens per second
  (fastest of `passes` passes). On
  TensorFlow the search is a `tf.function` (`make_search_fn`); on JAX the same
  `decoding.beam_search` under `jax.jit`; on PyTorch eagerly.
* **the anchor, keras-hub's generation**: `keras_hub.samplers.BeamSampler` (K beams)
  driving the same model's cached `decode_step` over the same source batches
  (`peers.keras_hub_beam_search`), compiled as keras-hub compiles its own generation: XLA
  on TensorFlow, `jax.jit` on JAX, eager on PyTorch. Its algorithm is keras-hub's (no
  length penalty, beams go on until every beam of the batch has ended), so its outputs
  are counted against ours, not required to equal them.

Each process also writes the token ids it decoded (the best hypothesis up to EOS), so the
report states how many sentences each backend decoded exactly as TensorFlow did. The
report keeps each backend's fastest round.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BACKENDS = ("tensorflow", "jax", "torch")
WEIGHTS = "model.weights.h5"
TRAIN_BATCHES = "train_batches.npz"
SOURCE_BATCHES = "source_batches.npz"
SETTINGS = "settings.json"
# Timed passes per process over the training batches and over the source batches (default of
# `prepare`'s `passes`); each process reports its fastest.
PASSES = 3


def prepare(
    work_dir,
    model_dir,
    num_batches=20,
    batch_tokens=2048,
    num_sentences=128,
    batch_size=32,
    beam_size=None,
    length_penalty=None,
    max_output_offset=None,
    passes=PASSES,
):
    """Write the work directory from run `model_dir` (TensorFlow): config, tokenizer, weights,
    `num_batches` training batches of the run's corpus and `num_sentences` validation sources.
    The beam settings default to the run config's (`SearchOptions.from_config`); each backend's
    process times `passes` passes of each workload and keeps its fastest."""
    from keras_transformer.benchmark.decoding import source_batches
    from keras_transformer.data import make_dataset
    from keras_transformer.decoding.options import SearchOptions
    from keras_transformer.runs import load_run, load_run_pairs

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer, config = load_run(model_dir)
    options = SearchOptions.from_config(
        config,
        "beam",
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_output_offset=max_output_offset,
    )
    model.save_weights(work_dir / WEIGHTS)
    tokenizer_file = work_dir / "spm.model"
    tokenizer_file.write_bytes(tokenizer.model_proto)
    train = load_run_pairs(model_dir, "train")
    batches = list(
        make_dataset(
            train, tokenizer, batch_tokens=batch_tokens, max_length=config.max_length, shuffle=False
        )
        .take(num_batches)
        .as_numpy_iterator()
    )
    save_batches(work_dir / TRAIN_BATCHES, batches)
    sources = [source for source, _ in load_run_pairs(model_dir, "val")[:num_sentences]]
    decode = source_batches(tokenizer, sources, batch_size, config.max_length)
    np.savez(
        work_dir / SOURCE_BATCHES,
        **{f"batch_{index}": np.asarray(ids) for index, ids in enumerate(decode)},
    )
    settings = {
        "config": config.to_dict(),
        "num_batches": len(batches),
        "num_sentences": len(sources),
        "batch_size": batch_size,
        "passes": passes,
        "search": {
            "beam_size": options.beam_size,
            "length_penalty": options.length_penalty,
            "max_output_offset": options.max_output_offset,
        },
    }
    (work_dir / SETTINGS).write_text(json.dumps(settings))
    return settings


def save_batches(path, batches):
    """Write `(inputs, labels)` training batches (numpy) to one `.npz` file; `load_batches` reads it back."""
    arrays = {}
    for index, (inputs, labels) in enumerate(batches):
        arrays[f"source_ids_{index}"] = inputs["source_ids"]
        arrays[f"target_ids_{index}"] = inputs["target_ids"]
        arrays[f"labels_{index}"] = labels
    np.savez(path, **arrays)


def load_batches(path):
    """The `(inputs, labels)` batches that `save_batches` wrote to `path`, in order."""
    with np.load(path) as stored:
        count = sum(name.startswith("labels_") for name in stored.files)
        return [
            (
                {"source_ids": stored[f"source_ids_{i}"], "target_ids": stored[f"target_ids_{i}"]},
                stored[f"labels_{i}"],
            )
            for i in range(count)
        ]


def _load(work_dir):
    work_dir = Path(work_dir)
    settings = json.loads((work_dir / SETTINGS).read_text())
    train = load_batches(work_dir / TRAIN_BATCHES)
    with np.load(work_dir / SOURCE_BATCHES) as stored:
        sources = [stored[f"batch_{i}"] for i in range(len(stored.files))]
    return settings, train, sources


def _model(work_dir, settings):
    from keras_transformer import Transformer
    from keras_transformer.models.config import TransformerConfig

    config = TransformerConfig.from_dict(settings["config"])
    model = Transformer(config)
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    model.load_weights(Path(work_dir) / WEIGHTS)
    return model, config


def _time_training(model, config, batches, passes):
    import tensorflow as tf

    from keras_transformer.training import LabelSmoothedCrossEntropy, paper_optimizer

    model.compile(
        optimizer=paper_optimizer(config.hidden_dim, config.warmup_steps),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing),
    )

    def dataset():
        return tf.data.Dataset.from_generator(
            lambda: iter(batches),
            output_signature=(
                {
                    key: tf.TensorSpec([None, None], tf.int32)
                    for key in ("source_ids", "target_ids")
                },
                tf.TensorSpec([None, None], tf.int32),
            ),
        )

    model.fit(dataset(), epochs=1, verbose=0)  # compiles every shape
    seconds = []
    for _ in range(passes):
        started = time.perf_counter()
        model.fit(dataset(), epochs=1, verbose=0)
        seconds.append(time.perf_counter() - started)
    tokens = int(sum(np.count_nonzero(labels) for _, labels in batches))
    return {"seconds": min(seconds), "tokens": tokens, "tokens_per_second": tokens / min(seconds)}


def _search_function(model, backend, search, searcher="ours"):
    """One backend's compiled beam search over a batch of source ids -> token ids `(B, L)`.

    `searcher="ours"`: `decoding.beam_search` (on TensorFlow the exported search,
    `make_search_fn`). `"keras-hub"`: `peers.keras_hub_beam_search`, compiled as keras-hub
    compiles its own generation (XLA on TensorFlow).
    """
    from keras_transformer.decoding import beam_search

    if searcher == "keras-hub":
        from keras_transformer.benchmark.peers import keras_hub_beam_search

        def search_fn(ids):
            return keras_hub_beam_search(
                model, ids, search["beam_size"], search["max_output_offset"]
            )
    else:

        def search_fn(ids):
            return beam_search(model, ids, **search)[0][:, 0]

    if backend == "tensorflow":
        import tensorflow as tf

        if searcher == "keras-hub":
            return tf.function(search_fn, jit_compile=True)
        from keras_transformer.decoding import make_search_fn

        function = make_search_fn(model, "beam", **search)
        return lambda ids: function(ids)["token_ids"][:, 0]
    if backend == "jax":
        import jax

        return jax.jit(search_fn)
    return search_fn


def _until_eos(row):
    """A decoded row's tokens up to its first EOS (excluded) or PAD."""
    from keras_transformer.data.tokenizer import EOS_ID, PAD_ID

    ends = np.flatnonzero((row == EOS_ID) | (row == PAD_ID))
    return row[: ends[0] if len(ends) else len(row)].tolist()


def _time_decoding(model, backend, sources, search, passes, searcher="ours"):
    import keras

    function = _search_function(model, backend, search, searcher)
    for ids in sources:  # compiles every shape
        keras.ops.convert_to_numpy(function(ids))
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        outputs = [keras.ops.convert_to_numpy(function(ids)) for ids in sources]
        times.append(time.perf_counter() - started)
    seconds = min(times)
    token_ids = [_until_eos(row) for batch in outputs for row in batch]  # the best hypothesis
    output_tokens = sum(len(row) for row in token_ids)
    sentences = len(token_ids)
    return {
        "seconds": seconds,
        "sentences": sentences,
        "sentences_per_second": sentences / seconds,
        "output_tokens_per_second": output_tokens / seconds,
        "token_ids": token_ids,
    }


def worker(work_dir, out_file):
    """Time training and decoding on this process's backend; write the results as JSON."""
    import keras

    backend = keras.backend.backend()
    settings, train, sources = _load(work_dir)
    model, config = _model(work_dir, settings)
    # Decoding leaves the weights as they are; training last.
    passes = settings["passes"]
    decoding = _time_decoding(model, backend, sources, settings["search"], passes)
    keras_hub_decoding = _time_decoding(
        model, backend, sources, settings["search"], passes, searcher="keras-hub"
    )
    training = _time_training(model, config, train, passes)
    Path(out_file).write_text(
        json.dumps(
            {
                "backend": backend,
                "training": training,
                "decoding": decoding,
                "keras_hub_decoding": keras_hub_decoding,
            }
        )
    )


def run_rounds(work_dir, backends=BACKENDS, rounds=3, log=print, timeout=1800):
    """`rounds` rounds of one fresh process per backend (order rotating); returns each
    backend's list of results."""
    results = {backend: [] for backend in backends}
    for round_index in range(rounds):
        order = backends[round_index % len(backends) :] + backends[: round_index % len(backends)]
        for backend in order:
            out_file = Path(work_dir) / f"result_{backend}_{round_index}.json"
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
            if backend == "jax":
                env.setdefault("JAX_PLATFORMS", "cpu")
            started = time.monotonic()
            completed = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "keras_transformer.benchmark.backends",
                    str(work_dir),
                    str(out_file),
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
            if completed.returncode != 0:
                raise RuntimeError(
                    f"the {backend} process failed: {completed.stderr.strip().splitlines()[-1:]}"
                )
            result = json.loads(out_file.read_text())
            results[backend].append(result)
            log(
                f"round {round_index + 1}/{rounds} {backend}: training {result['training']['tokens_per_second']:.0f} "
                f"tokens/s, beam {result['decoding']['sentences_per_second']:.2f} sentences/s, keras-hub's beam "
                f"{result['keras_hub_decoding']['sentences_per_second']:.2f} sentences/s "
                f"({time.monotonic() - started:.0f} s with start-up and compilation)"
            )
    return results


def summarize(results, reference="tensorflow"):
    """Each backend's fastest round, its ratio to `reference`'s, how many decoded
    sentences equal `reference`'s token for token, and the keras-hub anchor on the same
    backend (ours / keras-hub's sentences per second, and how many of its best beams equal
    ours)."""
    best = {
        backend: {
            "training": max(run["training"]["tokens_per_second"] for run in runs),
            "decoding": max(run["decoding"]["sentences_per_second"] for run in runs),
            "output_tokens": max(run["decoding"]["output_tokens_per_second"] for run in runs),
            "token_ids": runs[0]["decoding"]["token_ids"],
            "keras_hub": max(run["keras_hub_decoding"]["sentences_per_second"] for run in runs),
            "keras_hub_token_ids": runs[0]["keras_hub_decoding"]["token_ids"],
        }
        for backend, runs in results.items()
    }
    base = best[reference]
    rows = []
    for backend, found in best.items():
        same = sum(a == b for a, b in zip(found["token_ids"], base["token_ids"]))
        agree = sum(a == b for a, b in zip(found["keras_hub_token_ids"], found["token_ids"]))
        rows.append(
            {
                "backend": backend,
                "training_tokens_per_second": found["training"],
                "training_ratio": found["training"] / base["training"],
                "beam_sentences_per_second": found["decoding"],
                "beam_ratio": found["decoding"] / base["decoding"],
                "output_tokens_per_second": found["output_tokens"],
                "same_outputs": f"{same}/{len(base['token_ids'])}",
                "keras_hub_sentences_per_second": found["keras_hub"],
                "over_keras_hub": found["decoding"] / found["keras_hub"],
                "keras_hub_same_as_ours": f"{agree}/{len(found['token_ids'])}",
            }
        )
    return rows


def format_summary(rows):
    header = (
        f"{'backend':<11} {'train tok/s':>11} {'vs TF':>6} {'beam sent/s':>11} {'vs TF':>6} "
        f"{'out tok/s':>9}  same outputs as TF  keras-hub beam sent/s  ours/keras-hub  keras-hub best = ours"
    )
    lines = [header]
    for row in rows:
        lines.append(
            f"{row['backend']:<11} {row['training_tokens_per_second']:>11.0f} {row['training_ratio']:>6.2f} "
            f"{row['beam_sentences_per_second']:>11.2f} {row['beam_ratio']:>6.2f} "
            f"{row['output_tokens_per_second']:>9.0f}  {row['same_outputs']:>18}"
            f"  {row['keras_hub_sentences_per_second']:>21.2f}  {row['over_keras_hub']:>14.2f}  "
            f"{row['keras_hub_same_as_ours']:>21}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
