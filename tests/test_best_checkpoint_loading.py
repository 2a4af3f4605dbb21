"""`--checkpoint=best` as parse.py and export.py pass it: `runs.load_ensemble` (parse.py) and
`runs.load_run` (export.py's `TranslationModule.from_run` and `export_ctranslate2`) read the
run's best checkpoint (`runs.resolve_checkpoint`), not the latest."""

import json
import shutil

import numpy as np

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
