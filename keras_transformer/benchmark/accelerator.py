r"""keras_hub_accelerator: training throughput on JAX or PyTorch, ours against the keras-hub
peer, on a GPU.

The training rows (`rows.training_rows`) time TensorFlow. This row times the same two models on the
other backends, where a GPU machine may have JAX or PyTorch and no TensorFlow at all. It
runs in two steps:

    # where the data and TensorFlow are: the batches (experiments/benchmark_accelerator.py)
    python experiments/benchmark_accelerator.py --work_dir=/tmp/gpu_batches --preset=base \
        --vocabulary_size=8000 --data_dir=../shared/data/multi30k --noworkers
    # on the accelerator: one process per backend (no TensorFlow needed)
    KERAS_BACKEND=jax python -m keras_transformer.benchmark.accelerator /tmp/gpu_batches [PRECISION]

`prepare` (TensorFlow) writes the work directory: the config, and training batches of the
corpus from our length-bucketed pipeline. Every bucket has its own batch shape and each
shape compiles once per model, so the batches are those of the `num_shapes` most common
shapes of one pass over the corpus (up to `per_shape` each), in the pipeline's order. The
training FLOPs of each batch's real lengths (`flops.training_flops`) go with them.

`worker` (any backend) builds our `Transformer` and the peer
(`peers.keras_hub_transformer`: the same sizes, dropout placement and dtype policy) and
compiles both with Keras' own training step, the same loss (`LabelSmoothedCrossEntropy`)
and optimizer (`paper_optimizer`), and `jit_compile="auto"` (JAX: XLA; PyTorch: eager).
One update is one `train_on_batch`, which waits for the result. Both are warmed up on
every shape, then take turns on every batch for `rounds` rounds
(`timing.compare_steps_per_batch`); each batch keeps its fastest time. It reports real
target tokens (labels that are not padding) per second, the peer's time over ours, and
model FLOP utilization against the device's peak for the compute dtype (GPU: the
published dense peak, `peaks.gpu_peak`; CPU: `peaks.cpu_peak`).
"""

import collections
import json
import sys
import time
from pathlib import Path

from keras_transformer.benchmark.backends import load_batches, save_batches

BATCHES = "batches.npz"
SETTINGS = "settings.json"


def select_batches(batches, num_shapes, per_shape):
    """The batches of the `num_shapes` most common `(source, target)` shapes, up to
    `per_shape` of each, in their original order (ties: the shape seen first)."""

    def shape(batch):
        inputs, _ = batch
        return tuple(inputs["source_ids"].shape), tuple(inputs["target_ids"].shape)

    taken = {key: 0 for key, _ in collections.Counter(map(shape, batches)).most_common(num_shapes)}
    selected = []
    for batch in batches:
        key = shape(batch)
        if key in taken and taken[key] < per_shape:
            taken[key] += 1
            selected.append(batch)
    return selected


def prepare(
    work_dir, config, pairs, tokenizer, precision, batch_tokens, num_shapes=3, per_shape=3, rounds=3
):
    """Write the work directory (TensorFlow): settings and the batches of `pairs`.

    Args:
        work_dir: the directory (created).
        config: the `TransformerConfig` both models are built from.
        pairs: training `(source, target)` sentence pairs.
        tokenizer: their `Tokenizer`.
        precision: the dtype policy of both models (e.g. "mixed_bfloat16").
        batch_tokens: the token budget of a batch (our pipeline's bucketing).
        num_shapes, per_shape: which batches (`select_batches`).
        rounds: timing rounds of the worker.

    Returns:
        The settings written.
    """
    from keras_transformer.benchmark.batches import real_lengths
    from keras_transformer.benchmark.flops import training_flops
    from keras_transformer.data.pipeline import make_dataset

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    dataset = make_dataset(
        pairs, tokenizer, batch_tokens=batch_tokens, max_length=config.max_length, shuffle=False
    )
    batches = select_batches(list(dataset.as_numpy_iterator()), num_shapes, per_shape)
    save_batches(work_dir / BATCHES, batches)
    tokens, flops = [], []
    for batch in batches:
        source_lengths, target_lengths = real_lengths([batch])
        tokens.append(int(target_lengths.sum()))
        flops.append(float(training_flops(config, source_lengths, target_lengths)))
    settings = {
        "config": config.to_dict(),
        "precision": precision,
        "batch_tokens": batch_tokens,
        "rounds": rounds,
        "shapes": [
            [list(inputs["source_ids"].shape), list(inputs["target_ids"].shape)]
            for inputs, _ in batches
        ],
        "target_tokens": tokens,
        "flops": flops,
    }
    (work_dir / SETTINGS).write_text(json.dumps(settings))
    return settings


def device_peak(backend, compute_dtype):
    """The peak of the device the backend computes on: its first GPU, else the CPUs."""
    from keras_transformer.benchmark.peaks import cpu_peak, gpu_peak

    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "gpu":
            # JAX's default matmul precision on these GPUs uses TF32 for float32.
            return gpu_peak(device.device_kind, compute_dtype, tf32=True)
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            return gpu_peak(
                torch.cuda.get_device_name(0),
                compute_dtype,
                tf32=torch.backends.cuda.matmul.allow_tf32,
            )
    return cpu_peak(compute_dtype)


def worker(work_dir, precision=None, log=print):
    """Time both models on this process's backend over the work directory's batches.

    Args:
        work_dir: written by `prepare`.
        precision: the dtype policy of both models (default: the settings').
        log: where the machine line goes.

    Returns (and writes to `result_<backend>_<precision>.json` in `work_dir`) the backend,
    device, peak, and per model: the fastest seconds of each batch, real target tokens/s,
    training FLOP/s and MFU.
    """
    import keras

    from keras_transformer.benchmark.peers import keras_hub_transformer
    from keras_transformer.benchmark.timing import compare_steps_per_batch, warm_up
    from keras_transformer.models import Transformer, TransformerConfig
    from keras_transformer.training import LabelSmoothedCrossEntropy, paper_optimizer

    work_dir = Path(work_dir)
    settings = json.loads((work_dir / SETTINGS).read_text())
    batches = load_batches(work_dir / BATCHES)
    config = TransformerConfig.from_dict(settings["config"])
    precision = precision or settings["precision"]
    backend = keras.backend.backend()
    keras.utils.set_random_seed(0)
    models = {
        "ours": Transformer(config, dtype=precision),
        "keras-hub": keras_hub_transformer(config, dtype=precision),
    }
    steps = {}
    for name, model in models.items():
        model.compile(
            optimizer=paper_optimizer(config.hidden_dim, config.warmup_steps),
            loss=LabelSmoothedCrossEntropy(config.label_smoothing),
        )
        steps[name] = model.train_on_batch
    compute_dtype = keras.dtype_policies.get(precision).compute_dtype
    peak = device_peak(backend, compute_dtype)
    log(f"backend {backend} (keras {keras.__version__}), {peak.describe()}")
    started = time.perf_counter()
    for name, step in steps.items():  # compile every shape, saying how long each took
        warm_up(step, batches, log=lambda line, name=name: log(f"{name}: {line}"))
    ours, peer = compare_steps_per_batch(
        steps["ours"], steps["keras-hub"], batches, rounds=settings["rounds"], warmed=True
    )
    log(
        f"timed {len(batches)} batches x {settings['rounds']} rounds x 2 models in "
        f"{time.perf_counter() - started:.0f} s (compilation included)"
    )
    tokens, flops = sum(settings["target_tokens"]), sum(settings["flops"])
    result = {
        "backend": backend,
        "device": peak.device,
        "peak_dtype": peak.dtype,
        "peak_flops_per_second": peak.flops_per_second,
        "precision": precision,
        "jit_compile": {name: bool(model.jit_compile) for name, model in models.items()},
        "models": {},
    }
    for name, seconds in (("ours", ours), ("keras-hub", peer)):
        total = sum(seconds)
        result["models"][name] = {
            "seconds": seconds,
            "tokens_per_second": tokens / total,
            "flops_per_second": flops / total,
            "mfu": flops / total / peak.flops_per_second,
        }
    (work_dir / f"result_{backend}_{precision}.json").write_text(json.dumps(result))
    return result


def format_result(result, settings):
    """The keras_hub_accelerator row as text: one line per model, then the ratio and each shape's ratio."""
    shapes = [tuple(map(tuple, shape)) for shape in settings["shapes"]]
    ours, peer = result["models"]["ours"], result["models"]["keras-hub"]
    lines = [
        f"keras_hub_accelerator: {result['backend']} on {result['device']}, {result['precision']} (peak: {result['peak_dtype']} "
        f"{result['peak_flops_per_second'] / 1e12:,.1f} TFLOP/s), {len(shapes)} batches of "
        f"{settings['batch_tokens']} tokens, {sum(settings['target_tokens'])} real target tokens, XLA: "
        + ", ".join(f"{name} {flag}" for name, flag in result["jit_compile"].items()),
        f"{'model':<10} {'real target tok/s':>17} {'TFLOP/s':>8} {'MFU':>6}",
    ]
    for name, model in result["models"].items():
        lines.append(
            f"{name:<10} {model['tokens_per_second']:>17,.0f} {model['flops_per_second'] / 1e12:>8.2f} "
            f"{model['mfu']:>6.3f}"
        )
    lines.append(
        f"ours / keras-hub (real target tokens/s): {ours['tokens_per_second'] / peer['tokens_per_second']:.2f}"
    )
    by_shape = {}  # (source, target) shape -> [our seconds, the peer's seconds, batches]
    for shape, mine, theirs in zip(shapes, ours["seconds"], peer["seconds"]):
        totals = by_shape.setdefault(shape, [0.0, 0.0, 0])
        totals[0], totals[1], totals[2] = totals[0] + mine, totals[1] + theirs, totals[2] + 1
    lines.append(
        "by batch shape (source, target): "
        + ", ".join(
            f"{source[0]}x{source[1]}/{target[1]}: {theirs / mine:.2f} ({mine * 1e3 / count:.1f} ms ours)"
            for (source, target), (mine, theirs, count) in by_shape.items()
        )
    )
    return "\n".join(lines)


if __name__ == "__main__":
    outcome = worker(sys.argv[1], *sys.argv[2:3])
    print(format_result(outcome, json.loads((Path(sys.argv[1]) / SETTINGS).read_text())))
