"""experiments/benchmark.py (its training and decoding rows), the keras-hub peer on equal terms, FLOP counts and hardware peaks."""

import re

import keras
import matplotlib.image
import numpy as np
import pytest

from keras_transformer import Transformer, get_preset
from keras_transformer.benchmark import (
    Row,
    cpu_peak,
    cpu_peak_flops,
    format_table,
    gpu_peak,
    keras_hub_transformer,
    training_flops,
)
from keras_transformer.benchmark.attention_scaling import (
    ScalingPoint,
    format_scaling_table,
    peak_bytes,
)
from keras_transformer.benchmark.backends import summarize as summarize_backends
from keras_transformer.benchmark.peers import attention_layers, keras_hub_beam_search
from keras_transformer.layers.dropout import ReplicaDropout
from tests.scripts import run_script

# The keys that start the training rows' names, in the order the script prints them.
TRAINING_ROWS = (
    "keras_hub_padded: ",
    "keras_hub_whole_pass: ",
    "keras_hub_per_batch: ",
    "keras_hub_target_rows: ",
    "bucketing: ",
    "skip_padding: ",
    "mfu: ",
    "matmul_fraction: ",
)

TABLE_HEADER = ["measurement", "ours", "peer/base", "ratio", "target"]

PEER_CONFIG = dict(
    vocabulary_size=100,
    num_encoder_layers=2,
    num_decoder_layers=3,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=2,
)


def _all_layers(model):
    return list(model._flatten_layers(include_self=False, recursive=True))


@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_peer_layers_compute_in_our_dtype(precision):
    config = get_preset("tiny", **PEER_CONFIG)
    ours = Transformer(config, dtype=precision)
    peer = keras_hub_transformer(config, dtype=precision)
    expected = keras.dtype_policies.get(precision).compute_dtype
    for model in (ours, peer):
        computing = {
            layer.name: layer.compute_dtype
            for layer in _all_layers(model)
            if not isinstance(layer, keras.layers.InputLayer) and layer.name != "logits"
        }
        assert set(computing.values()) == {expected}, (model.name, computing)
        assert {weight.dtype for weight in model.weights} == {"float32"}
    assert ours.count_params() == peer.count_params()
    logits = peer({"source_ids": np.array([[5, 6, 3]]), "target_ids": np.array([[2, 7]])})
    assert logits.dtype == "float32"


@pytest.mark.parametrize("attention_dropout", [0.0, 0.2])
def test_peer_drops_out_where_ours_does(attention_dropout):
    """Dropout on embedding sums and sub-layer outputs at `dropout`, on attention
    probabilities at `attention_dropout`, nowhere else, in both models."""
    config = get_preset("tiny", dropout=0.1, attention_dropout=attention_dropout, **PEER_CONFIG)
    ours = Transformer(config)
    peer = keras_hub_transformer(config)
    ours_attention = [layer for layer in _all_layers(ours) if hasattr(layer, "query_kernel")]
    peer_attention = [
        attention for layer in _all_layers(peer) for attention in attention_layers(layer)
    ]
    assert len(ours_attention) == len(peer_attention) == 2 + 2 * 3
    assert {layer._dropout_layer.rate for layer in ours_attention} == {attention_dropout}
    assert {layer._dropout for layer in peer_attention} == {attention_dropout}
    assert {layer._dropout_layer.rate for layer in peer_attention} == {attention_dropout}
    inner = {id(layer._dropout_layer) for layer in ours_attention + peer_attention}
    for model in (ours, peer):
        others = [
            layer.rate
            for layer in _all_layers(model)
            if isinstance(layer, (keras.layers.Dropout, ReplicaDropout))
            and id(layer) not in inner
            and layer.rate > 0
        ]
        assert others == [0.1] * (
            2 + 2 * 2 + 3 * 3
        )  # embedding sums, 2 per encoder block, 3 per decoder block


@pytest.mark.parametrize("normalize_first", [False, True])
def test_peer_target_rows_give_the_peers_loss_and_gradients(normalize_first):
    """The peer of the keras_hub_target_rows row (`PeerTargetRows`): on the peer's weights, the real target positions'
    logits, the loss and every gradient of the peer's full `(B, T, V)` logits."""
    import tensorflow as tf

    from keras_transformer.benchmark.peers import PeerTargetRows
    from keras_transformer.training.loss import label_smoothed_nll, labels_and_logits

    config = get_preset("tiny", dropout=0.0, normalize_first=normalize_first, **PEER_CONFIG)
    peer = keras_hub_transformer(config)
    inputs = {
        "source_ids": np.array([[5, 6, 7, 3], [8, 9, 3, 0]]),
        "target_ids": np.array([[1, 5, 6], [1, 7, 0]]),
    }
    labels = np.array([[5, 6, 2], [7, 2, 0]])
    results = []
    for model in (peer, PeerTargetRows(peer, config)):
        with tf.GradientTape() as tape:
            targets, logits = labels_and_logits(model, inputs, labels, training=True)
            loss_sum, tokens = label_smoothed_nll(targets, logits)
        results.append(
            (
                np.asarray(logits),
                float(loss_sum),
                float(tokens),
                tape.gradient(loss_sum, model.trainable_variables),
            )
        )
    (full, full_loss, full_tokens, full_grads), (rows, rows_loss, rows_tokens, rows_grads) = results
    assert rows.shape == (5, config.vocabulary_size)
    np.testing.assert_allclose(rows, full[labels != 0], rtol=0, atol=1e-5)
    assert abs(rows_loss - full_loss) <= 1e-5 and rows_tokens == full_tokens == 5
    for theirs, ours in zip(full_grads, rows_grads, strict=True):
        np.testing.assert_allclose(
            np.asarray(tf.convert_to_tensor(ours)),
            np.asarray(tf.convert_to_tensor(theirs)),
            rtol=0,
            atol=1e-5,
        )


def test_peer_refuses_what_it_cannot_express():
    with pytest.raises(ValueError, match="activation_dropout=0.1"):
        keras_hub_transformer(get_preset("tiny", activation_dropout=0.1, **PEER_CONFIG))
    with pytest.raises(ValueError, match="attention_window=4"):
        keras_hub_transformer(get_preset("tiny", attention_window=4, **PEER_CONFIG))
    for name, value in (
        ("share_embeddings", False),
        ("tie_output", False),
        ("final_logits_bias", True),
        ("positional", "learned"),
        ("sinusoid_layout", "concatenated"),
    ):
        with pytest.raises(ValueError, match=f"Received: {name}={value!r}"):
            keras_hub_transformer(get_preset("tiny", **{**PEER_CONFIG, name: value}))
    separate = dict(PEER_CONFIG, share_embeddings=False, target_vocabulary_size=60)
    with pytest.raises(ValueError, match="Received: target_vocabulary_size=60"):
        keras_hub_transformer(get_preset("tiny", **separate))


# D=16, d_ff=32, V=100, one layer each side: the sizes the FLOP counts below are worked out for.
HAND_COUNT_SIZES = dict(
    vocabulary_size=100,
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=2,
)


def test_training_flops_matches_parameter_count_for_linear_layers():
    # With one-token sequences attention costs 4*D per layer-pair of scores/values; the rest
    # is 2 FLOPs per weight per token, times 3 for training.
    config = get_preset("tiny", **HAND_COUNT_SIZES)
    model = Transformer(config)
    weights = {
        w.path: int(np.prod(w.shape))
        for w in model.trainable_weights
        if w.path.endswith(("kernel", "embeddings"))
    }
    matrix_weights = sum(
        weights.values()
    )  # encoder, decoder, embedding (used once as output projection)
    flops = training_flops(config, [1], [1])
    attention = (
        3 * 2 * (1 * 2 * 16 + 2 * 2 * 16)
    )  # encoder self + decoder self + cross, QK and AV, one token
    np.testing.assert_allclose(flops, 3 * 2 * matrix_weights + attention, rtol=1e-9)


def test_training_flops_counts_attention_by_real_lengths():
    # Hand count, D=16, d_ff=32, V=100, one layer each side, sources of 3 and 5 tokens,
    # targets of 2 and 4 (2 FLOPs per multiply-add, forward):
    #   encoder projections + FFN: 2 * (4*D*D + 2*D*F) * 8 tokens            = 32,768
    #   encoder scores and weighted sums: 2 * 2 * D * (3^2 + 5^2)             =  2,176
    #   decoder self Q,K,V,O + cross Q,O + FFN: 2 * (6*D*D + 2*D*F) * 6 tokens = 30,720
    #   cross K, V of the 8 source tokens: 2 * 2*D*D * 8                       =  8,192
    #   decoder self-attention: 2 * 2 * D * (2^2 + 4^2)                        =  1,280
    #   cross-attention: 2 * 2 * D * (3*2 + 5*4)                               =  1,664
    #   output projection: 2 * D * V * 6                                       = 19,200
    # total 96,000, times 3 for a training step (forward + backward).
    config = get_preset("tiny", **HAND_COUNT_SIZES)
    assert training_flops(config, [3, 5], [2, 4]) == 3 * 96_000


def test_training_flops_projects_onto_the_target_vocabulary():
    # The hand count above with a source vocabulary of 100 and a target vocabulary of 60:
    # the output projection is 2 * D * 60 * 6 = 11,520 (the source embedding is a lookup,
    # no multiplication), so 96,000 - 19,200 + 11,520 = 88,320 forward, times 3.
    config = get_preset(
        "tiny", **HAND_COUNT_SIZES, target_vocabulary_size=60, share_embeddings=False
    )
    assert training_flops(config, [3, 5], [2, 4]) == 3 * 88_320


CPUINFO = """processor\t: {processor}
model name\t: Test CPU
physical id\t: 0
core id\t: {core}
cpu MHz\t\t: 2000.000
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16

"""


def _cpuinfo(cores):
    """Two hyper-threads (logical CPUs 2c and 2c+1) on each of `cores` cores."""
    return "".join(CPUINFO.format(processor=cpu, core=cpu // 2) for cpu in range(2 * cores))


def test_cpu_peak_formula_on_known_inputs():
    assert cpu_peak_flops(cores=2, fma_units=2, simd_lanes=8, clock_hz=2.5e9) == 160e9
    # 2 cores (4 hyper-threads), AVX-512: 16 float32 lanes, 32 with AVX512_BF16, 2 GHz
    peak = cpu_peak("float32", cpuinfo=_cpuinfo(2), usable_cpus=[0, 1, 2, 3])
    assert peak.flops_per_second == 2 * 2 * 16 * 2 * 2.0e9
    assert peak.formula == "2 cores x 2 FMA units x 16 float32 lanes x 2 x 2.000 GHz"
    assert (
        cpu_peak("bfloat16", cpuinfo=_cpuinfo(2), usable_cpus=[0, 1, 2, 3]).flops_per_second
        == 2 * 2 * 32 * 2 * 2e9
    )
    # no AVX512_FP16: float16 runs at the float32 rate
    assert (
        cpu_peak("float16", cpuinfo=_cpuinfo(2), usable_cpus=[0, 1, 2, 3]).flops_per_second
        == 2 * 2 * 16 * 2 * 2e9
    )
    # two hyper-threads of one core share its FMA units; a given maximum clock wins
    peak = cpu_peak(
        "float32", fma_units=1, cpuinfo=_cpuinfo(2), usable_cpus=[0, 1], max_frequency_khz=3.0e6
    )
    assert peak.flops_per_second == 1 * 1 * 16 * 2 * 3.0e9
    avx2_only = _cpuinfo(1).replace(" avx512f avx512_bf16", "")
    assert (
        cpu_peak("bfloat16", cpuinfo=avx2_only, usable_cpus=[0, 1]).flops_per_second
        == 1 * 2 * 8 * 2 * 2e9
    )
    assert (
        "CPU flags: sse2" not in peak.describe()
        and "CPU flags: avx avx2 fma avx512f avx512_bf16" in peak.describe()
    )
    assert (
        "CPU flags: avx avx2 fma\n"
        in cpu_peak("bfloat16", cpuinfo=avx2_only, usable_cpus=[0, 1]).describe() + "\n"
    )


def test_cpu_peak_of_bfloat16_is_the_amx_unit_where_the_cpu_has_one():
    amx = _cpuinfo(2).replace("avx512_bf16", "avx512_bf16 avx512_fp16 amx_tile amx_bf16")
    peak = cpu_peak("bfloat16", cpuinfo=amx, usable_cpus=[0, 2])
    assert peak.flops_per_second == 2 * 1024 * 2.0e9
    assert peak.formula == "2 cores x 1024 FLOP/cycle (AMX) x 2.000 GHz"
    assert "AMX: amx_bf16" in peak.describe() and "FMA units" not in peak.describe()
    # float32 stays on the vector units; float16 has no AMX unit without amx_fp16
    assert (
        cpu_peak("float32", cpuinfo=amx, usable_cpus=[0, 2]).flops_per_second
        == 2 * 2 * 16 * 2 * 2e9
    )
    assert (
        cpu_peak("float16", cpuinfo=amx, usable_cpus=[0, 2]).flops_per_second
        == 2 * 2 * 32 * 2 * 2e9
    )
    assert (
        cpu_peak(
            "float16", cpuinfo=amx.replace("amx_bf16", "amx_bf16 amx_fp16"), usable_cpus=[0, 2]
        ).flops_per_second
        == 2 * 1024 * 2e9
    )


def test_cpu_peak_of_this_machine_names_its_inputs():
    peak = cpu_peak("float32")
    text = peak.describe()
    for word in (
        "cores x",
        "FMA units x",
        "float32 lanes x 2 x",
        "GHz",
        "GFLOP/s",
        "clock:",
        "SIMD:",
    ):
        assert word in text
    assert peak.flops_per_second > 1e9


def test_gpu_peaks_are_the_published_dense_ones():
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bfloat16").flops_per_second == 989.4e12
    assert gpu_peak("NVIDIA H100 PCIe", "float16").flops_per_second == 756e12
    assert gpu_peak("NVIDIA H200", "bfloat16").flops_per_second == 989.4e12
    a100 = gpu_peak("NVIDIA A100-SXM4-80GB", "float32")
    assert (a100.dtype, a100.flops_per_second) == (
        "tf32",
        156e12,
    )  # TensorFlow's float32 matmuls on Ampere
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "float32", tf32=False).flops_per_second == 19.5e12
    assert gpu_peak("NVIDIA L4", "float16").flops_per_second == 121e12
    with pytest.raises(ValueError, match="NVIDIA L40S"):
        gpu_peak("NVIDIA L40S", "float32")


def test_format_table_marks_targets():
    rows = [
        Row("faster: a", 2.0, 1.0, 2.0, 1.25),
        Row("slower: b", 1.0, 2.0, 0.5, 1.0),
        Row("no_target: c", 3.0, 6.0, 0.5, None),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == TABLE_HEADER
    assert lines[1].split()[-2:] == ["1.25", "ok"]
    assert lines[2].split()[-2:] == ["1.00", "MISSED"]
    assert lines[3].split()[-1] == "-"


def test_benchmark_script_prints_the_table(multi30k_dir, tmp_path):
    result = run_script(
        "benchmark.py",
        f"--data_dir={multi30k_dir}",
        "--preset=tiny",
        "--num_encoder_layers=1",
        "--num_decoder_layers=1",
        "--hidden_dim=32",
        "--intermediate_dim=64",
        "--num_heads=2",
        "--vocabulary_size=500",
        "--max_length=32",
        "--steps=2",
        "--batch_tokens=512",
        "--padded_batch=8",
        "--padded_length=16",
        "--rounds=1",
        "--matmul_size=256",
        f"--plot={tmp_path / 'ratios.png'}",
    )
    for row in (
        "keras_hub_padded: train steps/s",
        "keras_hub_whole_pass: real target tokens/s, same bucketed batches",
        "bucketing: real target tokens/s, bucketed vs fixed padding, ours",
        "skip_padding: the same batches, ours vs ours computing at the padding",
        "mfu: training FLOP/s / float32 peak",
        "matmul_fraction: training FLOP/s / measured float32 matmul FLOP/s",
        "keras_hub_per_batch by batch shape",
        "peak: ",
        "FMA units x",
    ):
        assert row in result.stdout
    assert "parameters: ours" in result.stdout
    lines = result.stdout.splitlines()
    for name in TRAINING_ROWS:  # printed as measured, then in the table
        assert sum(line.startswith(name) for line in lines) == 2, name
    header = max(i for i, line in enumerate(lines) if line.split() == TABLE_HEADER)
    table = lines[header + 1 :]  # the table after the rows printed as measured
    assert [line.partition(":")[0] + ": " for line in table[: len(TRAINING_ROWS)]] == list(
        TRAINING_ROWS
    )
    assert matplotlib.image.imread(tmp_path / "ratios.png").shape[2] in (3, 4)


def test_compare_steps_warms_up_each_shape_once_then_times_every_round():
    """The first round traces every distinct batch shape before its clock starts; later rounds only time."""
    from keras_transformer.benchmark.timing import compare_steps

    calls = {"first": 0, "second": 0}

    def counting(name):
        def step(inputs, labels):
            calls[name] += 1
            return 0.0

        return step

    def batch(width):
        return {"source_ids": np.zeros((2, width)), "target_ids": np.zeros((2, width))}, None

    batches = [batch(4), batch(8), batch(4)]  # two shapes, three batches
    seconds = compare_steps(
        (counting("first"), batches), (counting("second"), batches[:1]), rounds=3
    )
    assert calls == {"first": 2 + 3 * 3, "second": 1 + 3 * 1}
    assert all(value >= 0 for value in seconds)


def test_fastest_of_alternating_reverses_the_order_every_other_round_and_keeps_each_fastest():
    import time

    from keras_transformer.benchmark.timing import fastest_of_alternating

    calls = []

    def workload(name, slow_call):
        def run():
            calls.append(name)
            time.sleep(0.05 if calls.count(name) == slow_call else 0.0)
            return len(calls)

        return run

    fastest = fastest_of_alternating({"a": workload("a", 1), "b": workload("b", 3)}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert (
        fastest["a"][0] < 0.05 and fastest["b"][0] < 0.05
    )  # each keeps a round without its slow call
    assert fastest["a"][1] == 5 and fastest["b"][1] == 6  # the result of each one's last call


def test_compare_steps_per_batch_alternates_on_every_batch_and_keeps_each_batchs_fastest():
    """Row b1': after one warm-up per shape, the steps take turns on each batch, the first to
    go alternating between rounds, and each batch's time is its own step's."""
    import time

    from keras_transformer.benchmark.timing import compare_steps_per_batch

    calls = []

    def sleeping(name, slow_width):
        def step(inputs, labels):
            width = inputs["target_ids"].shape[1]
            calls.append((name, width))
            if width == slow_width:
                time.sleep(0.05)
            return 0.0

        return step

    def batch(width):
        return {"source_ids": np.zeros((2, width)), "target_ids": np.zeros((2, width))}, None

    batches = [batch(4), batch(8), batch(6)]
    first, second = compare_steps_per_batch(
        sleeping("first", 8), sleeping("second", 6), batches, rounds=2
    )
    timed = calls[6:]  # after three warm-up calls for each step (three shapes)
    assert timed == [
        ("first", 4),
        ("second", 4),
        ("first", 8),
        ("second", 8),
        ("first", 6),
        ("second", 6),
        ("second", 4),
        ("first", 4),
        ("second", 8),
        ("first", 8),
        ("second", 6),
        ("first", 6),
    ]
    assert first[1] >= 0.05 and second[2] >= 0.05
    assert first[0] < 0.05 and first[2] < 0.05 and second[0] < 0.05 and second[1] < 0.05


def test_benchmark_decoding_row_alone(trained_run, multi30k_dir, tmp_path):
    from keras_transformer.export import TranslationModule, export_saved_model

    baseline = export_saved_model(
        TranslationModule.from_run(trained_run), tmp_path, "baseline", verify=False, check_ops=False
    ).path  # the run's search settings, as row d's own export
    result = run_script(
        "benchmark.py",
        f"--data_dir={multi30k_dir}",
        "--notraining",
        f"--model_dir={trained_run}",
        "--decode_sentences=4",
        "--saved_model_sentences=6",
        "--ctranslate2",
        "--ctranslate2_sentences=4",
        "--threads=2",
        "--rounds=1",
        "--decode_batch_sizes=4",
        f"--saved_model_baseline={baseline}",
    )
    # Each part announced on stderr as it starts (the CTranslate2 exports take a while).
    announced = [line for line in result.stderr.splitlines() if line.startswith("... ")]
    assert [line.split(":")[0] for line in announced] == [
        "... Decoding rows",
        "... CTranslate2 rows",
    ]
    assert "cached_search_graph: beam 4 sentences/s, cached vs recompute" in result.stdout
    assert "cached_search_xla: beam 4 sentences/s, cached vs recompute" in result.stdout
    assert "saved_model: 6 test sentences, beam 4 (s)" in result.stdout
    assert "saved_model_vs_baseline: seconds, same outputs 6/6" in result.stdout
    assert (
        "ctranslate2: 4 sentences, beam 4, alpha 0.6 (each engine's own length penalty)"
        in result.stdout
    )
    for name in ("ctranslate2_float32", "ctranslate2_in_process", "ctranslate2_int8_gain"):
        assert sum(line.startswith(f"{name}: ") for line in result.stdout.splitlines()) == 1, name
    assert "ctranslate2_int8: SavedModel vs CTranslate2 int8, sentences/s" in result.stdout
    assert "keras_hub_padded" not in result.stdout and "parameters: ours" not in result.stdout
    assert "signature_serialization" not in result.stderr, result.stderr[
        -2000:
    ]  # the export's INFO lines
    result = run_script("benchmark.py", "--notraining", check=False)
    assert (
        result.returncode != 0
        and "give --model_dir, --attention_scaling or --profile_training" in result.stderr
    )
    result = run_script(
        "benchmark.py",
        "--notraining",
        "--attention_scaling",
        "--vocabulary_map=20,500",
        check=False,
    )
    assert (
        result.returncode != 0
        and "--vocabulary_map=20,500 is used by the ctranslate2 rows (--ctranslate2)"
        in result.stderr
    )


def test_attention_scaling_row(tmp_path):
    """The attention_scaling table's code at two tiny lengths (no timing claims): the table, its growth column and the plot."""
    result = run_script(
        "benchmark.py",
        "--notraining",
        "--attention_scaling",
        "--scaling_lengths=16,64",
        "--scaling_window=4",
        "--scaling_repeats=2",
        "--preset=tiny",
        "--hidden_dim=16",
        "--num_heads=2",
        "--intermediate_dim=32",
        "--rounds=1",
        "--noscaling_memory",
        f"--scaling_plot={tmp_path / 'scaling.png'}",
    )
    assert (
        "attention_scaling: one encoder layer of preset tiny (d_model 16, 2 heads, d_ff 32, dropout 0.1)"
        in result.stdout
    )
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| n | full: ms (growth per doubling) | r = 4: ms")
    assert [row.split(" | ")[0] for row in table[1:]] == ["| 16", "| 64"]
    assert table[2].count("x)") == 2  # growth per doubling of the time, full and windowed
    assert matplotlib.image.imread(tmp_path / "scaling.png").shape[2] in (3, 4)
    result = run_script(
        "benchmark.py", "--notraining", "--attention_scaling", "--scaling_lengths=16,x", check=False
    )
    assert result.returncode != 0 and "--scaling_lengths takes positive integers" in result.stderr


def test_peak_memory_of_one_step_in_a_fresh_process():
    # 2 heads x 2,048^2 float32 scores are 32 MiB per copy; the window-4 layer holds 2 x 2,048 x 4 x 12 of them.
    full = peak_bytes(2048, None, hidden_dim=16, num_heads=2, intermediate_dim=32)
    windowed = peak_bytes(2048, 4, hidden_dim=16, num_heads=2, intermediate_dim=32)
    assert full > 32 * 2**20 > windowed > 0


def test_scaling_table_reports_growth_per_doubling():
    points = [
        ScalingPoint(128, 0.01, 0.01, 2**20, 2**20),
        ScalingPoint(512, 0.16, 0.04, 16 * 2**20, 4 * 2**20),
    ]
    lines = format_scaling_table(points, 64).splitlines()
    assert lines[3].split(" | ") == [
        "| 512",
        "160.0 ms (4.00x)",
        "40.0 ms (2.00x)",
        "16.0 MiB (4.00x)",
        "4.0 MiB (2.00x)",
        "4.00x |",
    ]


def test_ctranslate2_row_on_a_handful_of_sentences(trained_run):
    """The CTranslate2 rows' code on 6 sentences (no timing claims): at alpha 0 the SavedModel, our
    in-process search and CTranslate2 float32 translate identically, so their BLEU is equal;
    with a vocabulary map that holds every token, so do the shortlisted engines. The int8
    SavedModel exports the quantized weights."""
    pytest.importorskip("ctranslate2")
    from keras_transformer.benchmark.rows import ctranslate2_rows
    from keras_transformer.data.sources import load_pairs
    from keras_transformer.decoding.shortlist import VocabularyMap
    from keras_transformer.runs import read_run_config

    every_token = VocabularyMap.every_token(read_run_config(trained_run)[0].vocabulary_size)
    lines = []
    rows = ctranslate2_rows(
        trained_run,
        load_pairs("builtin", "test")[:6],
        length_penalty=0.0,
        batch_sizes=(2, 4),
        sweep_sentences=4,
        rounds=2,
        tokenize="char",
        vocabulary_map=every_token,
        log=lines.append,
    )
    assert [row.name for row in rows] == [
        "ctranslate2_float32: SavedModel vs CTranslate2 float32, sentences/s",
        "ctranslate2_in_process: in-process search vs CTranslate2 float32",
        "ctranslate2_int8_gain: CTranslate2 int8 vs float32, sentences/s",
        "ctranslate2_int8: SavedModel vs CTranslate2 int8, sentences/s",
        "savedmodel_int8_gain: SavedModel int8 vs float32, sentences/s",
        "ctranslate2_int8_both: SavedModel int8 vs CTranslate2 int8",
        "ctranslate2_float32_vmap: shortlisted SavedModel vs CT2 + vmap",
        "ctranslate2_int8_vmap: shortlisted SavedModel vs CT2 + vmap",
    ]
    for row in rows:
        assert row.ours > 0 and row.base > 0 and row.ratio == pytest.approx(row.ours / row.base)
    # The int8 engine is the export of the quantized model: its weights take under half the space.
    sizes = re.fullmatch(
        r"ctranslate2: SavedModel variables ([\d.]+) MiB, int8 \(model.quantize\('int8'\)\) ([\d.]+) MiB",
        lines[0],
    )
    assert sizes and float(sizes[2]) < 0.5 * float(sizes[1]), lines[0]
    assert lines[1] == "ctranslate2: batch-size sweep on 4 sentences (sentences/s):" and lines[
        2
    ].split() == [
        "engine",
        "2",
        "4",
    ]
    assert len(lines) == 21 and lines[11].startswith("ctranslate2: 6 sentences, beam 4, alpha 0.0")
    assert all(
        line.split()[-4] in ("2", "4") for line in lines[13:]
    )  # each engine's fastest batch size
    bleu = {line[3:29].strip(): float(line.split()[-1]) for line in lines[13:]}
    assert set(bleu) == {
        "SavedModel",
        "SavedModel int8",
        "in-process search",
        "CTranslate2 float32",
        "CTranslate2 int8",
        "SavedModel + shortlist",
        "CTranslate2 float32 + vmap",
        "CTranslate2 int8 + vmap",
    }
    # Each row divides the rates of the engines its name says (the table's sentences/s).
    rate = {line[3:29].strip(): float(line.split()[-3]) for line in lines[13:]}
    compared = [
        ("SavedModel", "CTranslate2 float32"),
        ("in-process search", "CTranslate2 float32"),
        ("CTranslate2 int8", "CTranslate2 float32"),
        ("SavedModel", "CTranslate2 int8"),
        ("SavedModel int8", "SavedModel"),
        ("SavedModel int8", "CTranslate2 int8"),
        ("SavedModel + shortlist", "CTranslate2 float32 + vmap"),
        ("SavedModel + shortlist", "CTranslate2 int8 + vmap"),
    ]
    for row, (ours, base) in zip(rows, compared):
        assert (round(row.ours, 2), round(row.base, 2)) == (rate[ours], rate[base]), row.name
    assert bleu["SavedModel"] == bleu["in-process search"] == bleu["CTranslate2 float32"]
    assert bleu["SavedModel + shortlist"] == bleu["SavedModel"]
    assert bleu["CTranslate2 float32 + vmap"] == bleu["CTranslate2 float32"]


def test_profile_of_a_fresh_instance_keeps_the_ops_that_unprofiled_runs_would_find_cheap():
    """TensorFlow stops tracing an op once unprofiled runs of its function instance found it
    cheap (a gather of two floats: a few hundred cycles, against its threshold of ~8,000), so
    after five unprofiled runs of an instance its profile has no `GatherV2` (not asserted:
    one preempted gather late in the warm-up keeps it traced). `fresh_op_times` profiles a new
    instance, whose every op is traced, so the gathers are in it even after another instance
    of the same function has run unprofiled."""
    import tensorflow as tf

    from keras_transformer.benchmark.profile import by_type, fresh_op_times

    def make_function():
        @tf.function
        def swap_many_times(pair):
            return tf.while_loop(
                lambda i, pair: i < 300, lambda i, pair: (i + 1, tf.gather(pair, [1, 0])), (0, pair)
            )[1]

        return swap_many_times

    pair = tf.constant([1.0, 2.0])
    warmed = make_function()
    for _ in range(5):
        warmed(pair)
    result, times = fresh_op_times(make_function, pair)
    assert result.numpy().tolist() == [1.0, 2.0]
    assert by_type(times, top=None)["GatherV2"] > 0


def test_saved_model_profile_finds_the_beam_reorder(trained_run):
    """The profile of a real export at two batch sizes: every op time is attributed, and the
    beam search's gathers of the cached keys/values show up as the reorder kind, apart from
    the two-stage top-k's own gathers."""
    from keras_transformer.benchmark.profile import OP_KINDS, profile_run
    from keras_transformer.data.sources import load_pairs

    lines = []
    results = profile_run(
        trained_run,
        [source for source, _ in load_pairs("builtin", "test")[:8]],
        batch_sizes=(4, 8),
        rounds=1,
        log=lines.append,
    )
    assert set(results) == {4, 8}
    for result in results.values():
        assert result["sentences_per_second"] > 0
        assert sum(result["kinds"].values()) == pytest.approx(result["op_seconds"])
        kinds = result["kinds"]
        assert kinds.get("beam reorder (gathers of the cache)", 0) > 0, kinds
        assert kinds.get("decoder self-attention", 0) > 0 and kinds.get("encoder", 0) > 0, kinds
        assert "GatherV2" in result["types"]
    table = lines[-1].splitlines()
    assert table[0] == "| batch size | 4 | 8 |" and table[2].startswith(
        "| sentences/s (8 sentences) |"
    )
    assert {kind for kind, _ in OP_KINDS} >= {
        line.split(" | ")[0][2:] for line in table[4:] if line.startswith("| ")
    } - {"other"}


def test_training_profile_attributes_both_models_ops_to_their_parts():
    """One profiled step of our tiny model and its keras-hub peer: every op time lands in a part,
    and the parts both models have (attention, feed-forward, norms, output projection, Adam)
    are found under both naming schemes."""
    from keras_transformer.benchmark.peers import keras_hub_transformer
    from keras_transformer.benchmark.profile import OUTSIDE, training_profile

    config = get_preset(
        "tiny", vocabulary_size=64, dropout=0.1, num_encoder_layers=1, num_decoder_layers=1
    )
    ids = np.random.default_rng(0).integers(1, 64, size=(3, 4, 6)).astype("int32")
    batches = [({"source_ids": ids[0], "target_ids": ids[1]}, ids[2])]
    lines = []
    results = training_profile(
        {"ours": Transformer(config), "keras-hub": keras_hub_transformer(config)},
        config,
        batches,
        log=lines.append,
    )
    for name, result in results.items():
        assert result["step_seconds"] > 0
        assert sum(result["parts"].values()) == pytest.approx(result["op_seconds"])
        for part in (
            "attention",
            "feed-forward",
            "layer norm",
            "dropout",
            "output projection and embedding",
            "optimizer (Adam)",
            OUTSIDE,
        ):
            assert result["parts"].get(part, 0.0) > 0, (name, part)
    assert lines[0].splitlines()[0] == "| graph mode, 1 batches | ours | keras-hub |"


def test_backend_summary_keeps_each_backends_fastest_round_and_counts_tensorflows_outputs():
    def run(tokens, sentences, token_ids, keras_hub, keras_hub_ids):
        return {
            "training": {"tokens_per_second": tokens},
            "decoding": {
                "sentences_per_second": sentences,
                "output_tokens_per_second": 10 * sentences,
                "token_ids": token_ids,
            },
            "keras_hub_decoding": {"sentences_per_second": keras_hub, "token_ids": keras_hub_ids},
        }

    results = {
        "tensorflow": [
            run(100.0, 4.0, [[5], [6]], 1.0, [[5], [6]]),
            run(200.0, 2.0, [[5], [6]], 2.0, [[5], [6]]),
        ],
        "jax": [
            run(50.0, 8.0, [[5], [7]], 0.5, [[5], [6]]),
            run(150.0, 1.0, [[5], [7]], 4.0, [[5], [6]]),
        ],
    }
    rows = {row["backend"]: row for row in summarize_backends(results)}
    assert (
        rows["tensorflow"]["training_ratio"] == 1.0 and rows["tensorflow"]["same_outputs"] == "2/2"
    )
    assert (
        rows["jax"]["training_tokens_per_second"] == 150.0 and rows["jax"]["training_ratio"] == 0.75
    )
    assert rows["jax"]["beam_sentences_per_second"] == 8.0 and rows["jax"]["beam_ratio"] == 2.0
    assert rows["jax"]["same_outputs"] == "1/2"
    # the anchor: each backend's fastest keras-hub round against its own fastest search, same backend
    assert (
        rows["tensorflow"]["over_keras_hub"] == 2.0
        and rows["tensorflow"]["keras_hub_same_as_ours"] == "2/2"
    )
    assert rows["jax"]["over_keras_hub"] == 2.0 and rows["jax"]["keras_hub_same_as_ours"] == "1/2"


def test_keras_hub_sampler_driving_our_model_at_one_beam_is_our_greedy_search(run_model):
    """The anchor feeds our cached `decode_step` to keras-hub's `BeamSampler` correctly: at
    one beam both searches take the argmax at every step, so the tokens up to EOS agree."""
    from keras_transformer.benchmark.decoding import source_batches
    from keras_transformer.data.tokenizer import EOS_ID
    from keras_transformer.decoding import greedy_search

    model, tokenizer, _ = run_model
    texts = [
        "twenty one",
        "four hundred thousand three",
        "seven",
        "nine hundred ninety nine thousand",
    ]
    (ids,) = source_batches(tokenizer, texts, len(texts), model.config.max_length)
    theirs = keras.ops.convert_to_numpy(
        keras_hub_beam_search(model, ids, beam_size=1, max_output_offset=10)
    )
    ours = keras.ops.convert_to_numpy(greedy_search(model, ids, max_output_offset=10)[0])

    ended = 0
    for their_row, our_row in zip(theirs.tolist(), ours.tolist()):
        # ours stops at EOS or at the sentence's own limit; keras-hub's goes on to the buffer's end
        length = our_row.index(EOS_ID) + 1 if EOS_ID in our_row else len([t for t in our_row if t])
        assert their_row[:length] == our_row[:length]
        ended += EOS_ID in our_row
    assert ended >= 2  # EOS is where both must stop


def test_backend_benchmark_times_every_backend_on_the_same_batches(trained_run, tmp_path):
    result = run_script(
        "benchmark_backends.py",
        f"--model_dir={trained_run}",
        f"--work_dir={tmp_path}",
        "--rounds=1",
        "--num_batches=2",
        "--num_sentences=8",
        "--batch_size=4",
        "--passes=1",
    )
    assert "CPU flags:" in result.stdout
    table = result.stdout.split("keras-hub best = ours")[1].strip().splitlines()
    assert [line.split()[0] for line in table] == ["tensorflow", "jax", "torch"]
    assert all(line.split()[6] == "8/8" for line in table), (
        result.stdout
    )  # the same beam outputs everywhere
    assert all(float(line.split()[8]) > 0 for line in table), (
        result.stdout
    )  # the keras-hub anchor, per backend
