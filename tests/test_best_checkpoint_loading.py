"""`--checkpoint=best` as parse.py and export.py pass it: `runs.load_ensemble` (parse.py) and
`runs.load_run` (export.py's `TranslationModule.from_run` and `export_ctranslate2`) read the
run's best checkpoint (`runs.resolve_checkpoint`), not the latest."""

import json
import shutil

import numpy as np
import pytest

from keras_transformer import runs


def test_load_run_and_load_ensemble_read_best_not_the_latest(trained_run, tmp_path):
    run = shutil.copytree(trained_run, tmp_path / "run")
    older, latest = runs.checkpoint_paths(runs.checkpoint_dir(run))[-2:]
    best = run / runs.BEST
    best.mkdir()
    name = older.rsplit("/", 1)[-1]
    for path in (run / "checkpoints").glob(f"{name}.*"):
        shutil.copy(path, best)
    record = {"step": runs.checkpoint_step(older), "score": 1.0, "metric": "bleu", "signature": ""}
    (best / runs.BEST_FILE).write_text(json.dumps({**record, "checkpoint": name}))

    expected = runs.load_run(run, checkpoint=older)[0].get_weights()
    newest = runs.load_run(run, checkpoint=latest)[0].get_weights()
    assert not all(np.array_equal(a, b) for a, b in zip(expected, newest))
    for load in (runs.load_run, lambda run, checkpoint: runs.load_ensemble([run], checkpoint)):
        weights = load(run, checkpoint=runs.BEST)[0].get_weights()
        assert len(weights) == len(expected)
        for got, want in zip(weights, expected):
            np.testing.assert_array_equal(got, want)


def test_a_checkpoint_and_averaging_together_are_refused_before_reading(tmp_path):
    # translate.py, parse.py and evaluate.py pass both flags on: `--checkpoint=best
    # --average_last=5` must not average the last five in silence.
    with pytest.raises(ValueError, match=r"checkpoint \(best\) or average_last \(5\), not both"):
        runs.load_run(tmp_path / "no_run_read", checkpoint="best", average_last=5)
