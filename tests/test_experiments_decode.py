"""Smoke tests of experiments/translate.py, evaluate.py and benchmark_decode.py (subprocesses)."""

import matplotlib.image

from tests.scripts import run_script


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
    per_line = [f"{kind}_layer{layer}.png" for kind in ("cross", "decoder_self", "encoder") for layer in (0, 1)]
    assert names == [f"line{index}_{name}" for index in (0, 2) for name in per_line]
    assert all(matplotlib.image.imread(plots / name).shape[0] > 100 for name in names)


def test_evaluate_prints_bleu_with_signature(trained_run, tmp_path):
    output = tmp_path / "hypotheses.de"
    stdout = run_script(
        "evaluate.py",
        f"--model_dir={trained_run}",
        "--split=test",
        "--max_sentences=6",
        "--beam_size=2",
        f"--output={output}",
    ).stdout
    assert "builtin/test: 6 sentences translated" in stdout
    assert "nrefs:1|case:mixed|eff:no|tok:char|smooth:exp|version:" in stdout
    assert "BLEU = " in stdout and "chrF2 = " in stdout and "exact match: " in stdout
    assert "beam_size=2" in stdout and "length_penalty=0.6" in stdout
    assert len(output.read_text(encoding="utf-8").splitlines()) == 6


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
