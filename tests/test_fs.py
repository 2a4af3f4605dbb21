"""The filesystem layer: every path through `tf.io.gfile`, and a URL stays a URL.

`file://` URLs take the same code path as `gs://` (a scheme, so no `pathlib` or
`os.path`); `ram://` is TensorFlow's in-memory filesystem, where nothing reaches the
local disk unless the code turned the URL into a local path.
"""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from keras_transformer import fs
from tests.conftest import TRAINED_RUN_CONFIG, TRAINED_RUN_STEPS
from tests.scripts import REPO, TINY_TRAIN_FLAGS, script_environment

SEQUENCE = str(REPO / "tests" / "script_sequence.py")


def test_urls_are_joined_as_urls_and_local_paths_stay_paths():
    assert fs.join("gs://bucket/run/", "checkpoints", "ckpt-1") == "gs://bucket/run/checkpoints/ckpt-1"
    assert fs.join("run", "checkpoints") == Path("run/checkpoints")
    assert fs.parent("gs://bucket/run/spm.model") == "gs://bucket/run"
    assert fs.name("s3://bucket/runs/demo/") == "demo"
    assert fs.as_path("ram://run") == "ram://run" and fs.as_path("run") == Path("run")


def test_errors_are_os_errors_naming_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="ram://fs_test/missing"):
        fs.read_bytes("ram://fs_test/missing")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OSError, match=f"^Cannot write to {tmp_path}/a_file/run: "):
        fs.check_writable(tmp_path / "a_file" / "run")
    fs.check_writable("ram://fs_test/run")
    assert fs.listdir("ram://fs_test/run") == []  # the probe file is gone


def test_the_user_path_on_ram(trained_run, tmp_path, monkeypatch, caplog):
    """Resume training, average, evaluate, plot, export and load the export, all on `ram://`.

    The run starts as a copy of the session's trained run (training from scratch writes
    the same files; the cross-process test below does it).
    """
    from keras_transformer.decoding import SavedModelTranslator
    from keras_transformer.evaluation import evaluate_run
    from keras_transformer.export import TranslationModule, export_saved_model
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import DataOptions, TrainOptions, train_translation, write_averaged_checkpoint
    from keras_transformer.visualization import plot_training_curves

    monkeypatch.chdir(tmp_path)
    root = "ram://user_path"
    run = f"{root}/run"
    fs.copy_tree(trained_run, run)
    step = TRAINED_RUN_STEPS + 2
    config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=step)
    options = TrainOptions(batch_tokens=1024, checkpoint_every=60, eval_every=0, log_every=60, progress=False)
    with caplog.at_level(logging.INFO, logger="absl"):
        _, results = train_translation(config, run, options, DataOptions("builtin"))
    assert f"Restored {run}/checkpoints/ckpt-{TRAINED_RUN_STEPS} at step {TRAINED_RUN_STEPS}" in caplog.text
    assert results["checkpoint"] == f"{run}/checkpoints/ckpt-{step}" and results["logs"] == f"{run}/logs"

    averaged, sources = write_averaged_checkpoint(run, last=2)
    assert averaged == f"{run}/averaged/ckpt-{step}"
    assert sources == [f"{run}/checkpoints/ckpt-{s}" for s in (TRAINED_RUN_STEPS, step)]
    evaluation = evaluate_run(run, split="test", max_sentences=4, average_last=2, output=f"{root}/eval/hyp.txt")
    assert len(fs.read_text(f"{root}/eval/hyp.txt").splitlines()) == len(evaluation.hypotheses) == 4
    plot_training_curves(run, f"{root}/plots/curves.png")

    export = export_saved_model(TranslationModule.from_run(run), f"{root}/saved_models", name="run", verify=False,
                                check_ops=False)
    assert export.path == f"{root}/saved_models/run/1" and export.version == 1
    translations, _ = SavedModelTranslator(f"{root}/saved_models/run")(["twenty one"])
    assert len(translations) == 1

    for path in ("run/config.json", "run/spm.model", "run/checkpoints/checkpoint", f"run/checkpoints/ckpt-{step}.index",
                 f"run/averaged/ckpt-{step}.index", "eval/hyp.txt", "plots/curves.png", "saved_models/run/models.config",
                 "saved_models/run/1/saved_model.pb", "saved_models/run/1/assets/spm.model",
                 "saved_models/run/1/assets.extra/tf_serving_warmup_requests",
                 "saved_models/run/1/assets.extra/export_info.json"):
        assert fs.isfile(f"{root}/{path}"), path
    assert fs.glob(f"{run}/logs/train/events.out.tfevents.*")
    assert list(tmp_path.iterdir()) == []  # nothing reached the working directory


def _write_split(directory, split, pairs):
    for side, index in (("src", 0), ("tgt", 1)):
        (directory / f"{split}.{side}").write_text("".join(pair[index] + "\n" for pair in pairs))
    return (directory / f"{split}.src").as_uri(), (directory / f"{split}.tgt").as_uri()


def test_the_user_path_with_file_urls_across_processes(tmp_path):
    """The scripts, with every directory and file a `file://` URL, run from an empty working directory.

    One process runs the scripts one after another (tests/script_sequence.py); every
    step reads what the previous ones wrote through the URLs only.
    """
    from keras_transformer.data.sources import load_pairs

    data, store, work = tmp_path / "data", tmp_path / "store", tmp_path / "cwd"
    data.mkdir(), work.mkdir()
    train_src, train_tgt = _write_split(data, "train", load_pairs("builtin", "train")[:600])
    val_src, val_tgt = _write_split(data, "val", load_pairs("builtin", "val")[:20])
    test_src, test_tgt = _write_split(data, "test", load_pairs("builtin", "test")[:4])
    run, exports, outputs = (store / "run").as_uri(), (store / "saved_models").as_uri(), (store / "out").as_uri()
    corpus = ["--dataset=files", f"--train_src={train_src}", f"--train_tgt={train_tgt}", f"--val_src={val_src}",
              f"--val_tgt={val_tgt}"]
    train = [f"--model_dir={run}", *corpus, *TINY_TRAIN_FLAGS, "--checkpoint_every=2", "--log_every=2"]
    test_split = ["--dataset=files", f"--src_file={test_src}", f"--ref_file={test_tgt}"]
    steps = [
        ("train.py", [*train, "--train_steps=2"]),
        ("train.py", [*train, "--train_steps=4", "--verbosity=0"]),  # INFO: the "Restored" line
        ("average_checkpoints.py", [f"--model_dir={run}", "--last=2"]),
        ("evaluate.py", [f"--model_dir={run}", *test_split, "--average_last=2", f"--output={outputs}/hyp.txt"]),
        ("translate.py", [f"--model_dir={run}", f"--input={test_src}", f"--output={outputs}/translations.txt"]),
        ("export.py", [f"--model_dir={run}", f"--export_dir={exports}", "--nocheck_ops", "--sample=twenty one"]),
    ]
    result = subprocess.run([sys.executable, SEQUENCE, json.dumps(steps)], cwd=work, env=script_environment(),
                            capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert f"Restored {run}/checkpoints/ckpt-2 at step 2" in output
    assert f"Checkpoints: {run}/checkpoints/ckpt-4" in output
    assert f"Wrote {run}/averaged/ckpt-4" in output
    assert f"Exported {exports}/run/1" in output
    assert "Sample (loaded export): 'twenty one' -> " in output
    assert f"MODEL_BASE_PATH={exports} -e MODEL_NAME=run" in output  # TF Serving reads the URL itself

    for path in ("run/config.json", "run/spm.model", "run/checkpoints/checkpoint", "run/checkpoints/ckpt-4.index",
                 "run/averaged/ckpt-4.index", "saved_models/run/1/saved_model.pb", "saved_models/run/models.config",
                 "saved_models/run/1/assets.extra/tf_serving_warmup_requests"):
        assert (store / path).is_file(), path
    assert list((store / "run" / "logs" / "train").glob("events.out.tfevents.*"))
    assert [len((store / "out" / name).read_text().splitlines()) for name in ("hyp.txt", "translations.txt")] == [4, 4]
    assert list(work.iterdir()) == []  # nothing in the working directory (no "file:" directory)
    assert not [path for path in tmp_path.rglob("*") if path.name.startswith("file:")]
