"""Smoke tests of experiments/translate.py, evaluate.py and benchmark_decode.py (subprocesses)."""

import shutil

import matplotlib.image
import pytest

from tests.scripts import run_script, run_sequence


def test_translate_reads_stdin_and_plots_attention(trained_run, tmp_path):
    plots = tmp_path / "attention"
    lines = ["twenty one", "", "four hundred thousand three"]
    stdout = run_script(
        "translate.py",
        f"--model_dir={trained_run}",
        "--method=greedy",
        "--batch_size=2",
        f"--plot_attention={plots}",
        stdin="\n".join(lines) + "\n",
    ).stdout
    outputs = stdout.split("\n")
    assert len(outputs) == len(lines) + 1 and outputs[-1] == ""  # one line per input line
    assert outputs[0] and outputs[1] == "" and outputs[2]
    names = sorted(path.name for path in plots.glob("*.png"))
    per_line = [
        f"{kind}_layer{layer}.png"
        for kind in ("cross", "decoder_self", "encoder")
        for layer in (0, 1)
    ]
    assert names == [f"line{index}_{name}" for index in (0, 2) for name in per_line]
    assert all(matplotlib.image.imread(plots / name).shape[0] > 100 for name in names)


def test_evaluate_prints_bleu_with_signature(trained_run, tmp_path):
    output = tmp_path / "hypotheses.de"
    result = run_script(
        "evaluate.py",
        f"--model_dir={trained_run}",
        "--split=test",
        "--max_sentences=6",
        "--beam_size=2",
        "--batch_size=4",
        f"--output={output}",
    )
    # The count on stderr after each batch (4 longest, then 2; text mode reads "\r" as a line end).
    assert result.stderr.splitlines()[-2:] == [
        "translated 4/6 sentences",
        "translated 6/6 sentences",
    ]
    stdout = result.stdout
    assert "builtin/test: 6 sentences translated" in stdout
    assert "nrefs:1|case:mixed|eff:no|tok:char|smooth:exp|version:" in stdout
    assert "BLEU = " in stdout and "chrF2 = " in stdout and "exact match: " in stdout
    assert "beam_size=2" in stdout and "length_penalty=0.6" in stdout
    assert len(output.read_text(encoding="utf-8").splitlines()) == 6


def assert_scored_on_french_and_german_refused(model_flag, multi30k_dir, refusal):
    """Run evaluate.py with `model_flag` (`--model_dir=...` or `--saved_model=...`, a model whose
    corpus says EN→FR on Multi30k) and no corpus flag (the defaults are builtin and EN→DE), then
    with `--tgt_lang=de`, in one process: the first is scored on the French references, the
    second is refused in one line, `error: --tgt_lang=de, but {refusal}: ...`."""
    from sacrebleu.metrics import BLEU

    from keras_transformer.data.sources import load_pairs

    common = [model_flag, "--max_sentences=4", "--noprogress"]
    result = run_sequence(
        [
            ["evaluate.py", [*common, "--split=test"]],
            ["evaluate.py", [*common, "--tgt_lang=de"], {"status": 2}],
        ]
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "multi30k/test en→fr: 4 sentences translated" in result.stdout
    # Scored against the French references: their length as sacreBLEU counts it (ref_len).
    ref_len = {
        language: BLEU(tokenize="13a")
        .corpus_score(
            ["-"] * 4,
            [[t for _, t in load_pairs("multi30k", "test", "en", language, multi30k_dir)[:4]]],
        )
        .ref_len
        for language in ("fr", "de")
    }
    assert ref_len["fr"] != ref_len["de"]
    assert f"ref_len = {ref_len['fr']})" in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: --tgt_lang=de, but {refusal}: leave --tgt_lang out to score it on fr. (see --help)"
    ]


def test_evaluate_scores_a_run_on_its_own_language_pair(trained_run, tmp_path, multi30k_dir):
    """A run whose config.json says EN→FR on Multi30k is scored on French references with no
    corpus flag given, and `--tgt_lang=de` is refused."""
    import json

    run = tmp_path / "en_fr"
    shutil.copytree(trained_run, run)
    config = json.loads((run / "config.json").read_text())
    config["data"].update(dataset="multi30k", tgt_lang="fr", data_dir=str(multi30k_dir))
    (run / "config.json").write_text(json.dumps(config))
    assert_scored_on_french_and_german_refused(
        f"--model_dir={run}", multi30k_dir, f"{run} translates en→fr (its config.json)"
    )


def test_benchmark_decode_smoke(trained_run):
    stdout = run_script(
        "benchmark_decode.py",
        f"--model_dir={trained_run}",
        "--num_sentences=4",
        "--batch_size=2",
        "--max_output_offset=8",
    ).stdout
    rows = [line.split()[:2] for line in stdout.splitlines()]
    for name in ("greedy", "beam4"):
        assert f"{name}: cached/recompute speedup" in stdout
        assert [name, "cached"] in rows and [name, "recompute"] in rows
    assert "4 sentences of builtin/test, batch 2" in stdout and "tokens/s" in stdout
    assert "CPU flags: " in stdout


def test_score_checkpoints_writes_bleu_at_checkpoint_times(trained_run, tmp_path):
    import tensorflow as tf

    from keras_transformer.evaluation import evaluate_run
    from keras_transformer.visualization import read_scalars

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # the shared run stays read-only
    plot = tmp_path / "curves.png"
    stdout = run_script(
        "score_checkpoints.py",
        f"--model_dir={run}",
        "--split=test",
        "--max_sentences=8",
        f"--plot={plot}",
    ).stdout
    assert "builtin/test, 8 sentences, greedy search" in stdout
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] in (["60"], ["120"])]
    assert [row[0] for row in rows] == ["60", "120"]
    scalars = read_scalars(run / "logs" / "checkpoints")
    assert scalars["bleu"].steps.tolist() == [60, 120]
    state = tf.train.get_checkpoint_state(str(run / "checkpoints"))
    assert scalars["bleu"].wall_times.tolist() == pytest.approx(
        list(state.all_model_checkpoint_timestamps)
    )
    # Each point is that checkpoint's own score.
    for step, bleu, row in zip((60, 120), scalars["bleu"].values, rows):
        expected = evaluate_run(
            run,
            split="test",
            max_sentences=8,
            method="greedy",
            checkpoint=str(run / "checkpoints" / f"ckpt-{step}"),
        ).scores.bleu
        assert bleu == pytest.approx(expected, abs=1e-4) and float(row[2]) == pytest.approx(
            expected, abs=0.006
        )
    assert matplotlib.image.imread(plot).shape[:2] == (700, 1700)


def test_score_checkpoints_script_averages_and_ensembles_at_each_step(trained_run, tmp_path):
    """`--average_last=2 --ensemble=...`: only step 120 has two checkpoints up to it; its BLEU is
    `evaluate_run`'s with the same settings. The second run holds the step-60 weights under both of
    its names, so it differs from the first (the library call is tested in test_evaluation.py)."""
    from keras_transformer.evaluation import evaluate_run
    from keras_transformer.visualization import read_scalars

    run, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(trained_run, run)
    shutil.copytree(trained_run, other)
    for early in (other / "checkpoints").glob("ckpt-60.*"):
        shutil.copyfile(early, early.with_name(early.name.replace("ckpt-60", "ckpt-120")))
    stdout = run_script(
        "score_checkpoints.py",
        f"--model_dir={run}",
        f"--ensemble={other}",
        "--average_last=2",
        "--split=test",
        "--max_sentences=8",
    ).stdout
    assert f"greedy search: {run} + {other}, each the average of its last 2 checkpoints" in stdout
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] in (["60"], ["120"])]
    assert [row[0] for row in rows] == ["120"]
    expected = evaluate_run(
        run, split="test", max_sentences=8, method="greedy", average_last=2, ensemble=[other]
    ).scores.bleu
    alone = evaluate_run(
        run, split="test", max_sentences=8, method="greedy", average_last=2
    ).scores.bleu
    assert expected != pytest.approx(alone, abs=1e-4)
    assert read_scalars(run / "logs" / "checkpoints")["bleu"].values.tolist() == pytest.approx(
        [expected], abs=1e-4
    )
