"""The filesystem layer: every path through `tf.io.gfile`, and a URL stays a URL.

`file://` URLs take the same code path as `gs://` (a scheme, so no `pathlib` or
`os.path`); `ram://` is TensorFlow's in-memory filesystem, where nothing reaches the
local disk unless the code turned the URL into a local path.
"""

from collections import Counter
from pathlib import Path

import pytest
import tensorflow as tf

from keras_transformer import fs
from tests.scripts import (
    TINY_BATCH_TOKENS,
    TINY_MODEL,
    TINY_TRAIN_FLAGS,
    run_sequence,
)


def test_urls_are_joined_as_urls_and_local_paths_stay_paths():
    assert (
        fs.join("gs://bucket/run/", "checkpoints", "ckpt-1") == "gs://bucket/run/checkpoints/ckpt-1"
    )
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


def test_the_user_path_on_ram(tmp_path, monkeypatch):
    """Train, resume, average, evaluate, translate, plot, export and load the export, all on `ram://`, in one process.

    The library's entry points (those the scripts call), from an empty working directory:
    every file they read or write is on `ram://`, which no local path reaches.
    """
    from keras_transformer.data.sources import load_pairs
    from keras_transformer.decoding import (
        SavedModelTranslator,
        Translator,
        decode_lines,
        translate_lines,
    )
    from keras_transformer.evaluation import evaluate_run
    from keras_transformer.export import TranslationModule, export_saved_model
    from keras_transformer.models.config import get_preset
    from keras_transformer.runs import load_run, read_starts
    from keras_transformer.training import (
        DataOptions,
        TrainOptions,
        train_translation,
        write_averaged_checkpoint,
    )
    from keras_transformer.visualization import plot_training_curves

    monkeypatch.chdir(tmp_path)
    root = "ram://user_path"
    run = f"{root}/run"
    files = {
        split: _write_split(f"{root}/data", split, load_pairs("builtin", split)[:size])
        for split, size in (("train", 300), ("val", 8), ("test", 2))
    }
    data = DataOptions("files", files={"train": files["train"], "val": files["val"]})
    options = TrainOptions(
        batch_tokens=TINY_BATCH_TOKENS,
        checkpoint_every=1,
        eval_every=0,
        log_every=1,
        progress=False,
    )

    _, first = train_translation(
        get_preset("tiny", **TINY_MODEL, train_steps=2), run, options, data
    )
    assert first["step"] == 2 and first["checkpoint"] == f"{run}/checkpoints/ckpt-2"
    trainer, resumed = train_translation(
        get_preset("tiny", **TINY_MODEL, train_steps=4), run, options, data
    )
    assert (
        resumed["step"] == trainer.step == 4
        and resumed["checkpoint"] == f"{run}/checkpoints/ckpt-4"
    )
    assert [start["step"] for start in read_starts(run)] == [0, 2]
    assert _logged_steps(f"{run}/logs/train", "loss") == {
        1: 1,
        2: 1,
        3: 1,
        4: 1,
    }  # the second start: 3 and 4 only

    averaged, sources = write_averaged_checkpoint(run, last=2)
    assert averaged == f"{run}/averaged/ckpt-4"
    assert sources == [f"{run}/checkpoints/ckpt-{step}" for step in (3, 4)]
    evaluation = evaluate_run(
        run,
        dataset="files",
        files={"test": files["test"]},
        average_last=2,
        output=f"{root}/eval/hyp.txt",
    )
    assert len(fs.read_text(f"{root}/eval/hyp.txt").splitlines()) == len(evaluation.hypotheses) == 2
    model, tokenizer, _ = load_run(run)
    lines, _ = decode_lines(fs.read_bytes(files["test"][0]))
    translations, _ = translate_lines(Translator(model, tokenizer, "greedy"), lines)
    fs.write_text(f"{root}/out/translations.txt", "".join(f"{text}\n" for text in translations))
    plot_training_curves(run, f"{root}/plots/curves.png")

    export = export_saved_model(
        TranslationModule.from_run(run),
        f"{root}/saved_models",
        name="run",
        warmup_sentences=["twenty one"],
        verify=False,
        check_ops=False,
    )
    assert export.path == f"{root}/saved_models/run/1" and export.version == 1
    translations, _ = SavedModelTranslator(f"{root}/saved_models/run")(["twenty one"])
    assert len(translations) == 1

    for path in (
        "run/config.json",
        "run/starts.jsonl",
        "run/spm.model",
        "run/checkpoints/checkpoint",
        *(f"run/checkpoints/ckpt-{step}.index" for step in range(1, 5)),
        "run/averaged/ckpt-4.index",
        "eval/hyp.txt",
        "out/translations.txt",
        "plots/curves.png",
        "saved_models/run/models.config",
        "saved_models/run/1/saved_model.pb",
        "saved_models/run/1/assets/spm.model",
        "saved_models/run/1/assets.extra/tf_serving_warmup_requests",
        "saved_models/run/1/assets.extra/export_info.json",
    ):
        assert fs.isfile(f"{root}/{path}"), path
    assert fs.listdir(f"{root}/saved_models/run") == [
        "1",
        "models.config",
    ]  # no temporary directory left
    assert list(tmp_path.iterdir()) == []  # nothing reached the working directory


def _logged_steps(log_dir, tag):
    """How many times each step's `tag` was logged in the TensorBoard event files of `log_dir` (all starts)."""
    records = (
        record
        for path in fs.glob(fs.join(log_dir, "events.out.tfevents.*"))
        for record in tf.data.TFRecordDataset(path)
    )
    events = (tf.compat.v1.Event.FromString(record.numpy()) for record in records)
    return Counter(
        event.step for event in events if any(value.tag == tag for value in event.summary.value)
    )


def _write_split(directory, split, pairs):
    """Write `pairs` as `<directory>/<split>.src` and `.tgt` (through `fs`); returns their URLs."""
    paths = []
    for side, index in (("src", 0), ("tgt", 1)):
        path = fs.join(directory, f"{split}.{side}")
        fs.write_text(path, "".join(pair[index] + "\n" for pair in pairs))
        paths.append(path.as_uri() if isinstance(path, Path) else path)
    return tuple(paths)


def test_the_user_path_with_file_urls_across_processes(tmp_path):
    """The scripts, with every directory and file a `file://` URL, run from an empty working directory.

    One process runs the scripts one after another (tests/script_sequence.py); every
    step reads what the previous ones wrote through the URLs only. The second training
    run hits a full disk at its save: one line, and the third resumes from the kept checkpoint.
    The first export hits a full disk while writing the SavedModel: one line, no version
    directory or temporary directory left, and the same command then exports version 1.
    """
    from keras_transformer.data.sources import load_pairs

    data, store, work = tmp_path / "data", tmp_path / "store", tmp_path / "cwd"
    data.mkdir(), work.mkdir()
    train_src, train_tgt = _write_split(data, "train", load_pairs("builtin", "train")[:300])
    val_src, val_tgt = _write_split(data, "val", load_pairs("builtin", "val")[:8])
    test_src, test_tgt = _write_split(data, "test", load_pairs("builtin", "test")[:2])
    run, exports, outputs = (
        (store / "run").as_uri(),
        (store / "saved_models").as_uri(),
        (store / "out").as_uri(),
    )
    corpus = [
        "--dataset=files",
        f"--train_src={train_src}",
        f"--train_tgt={train_tgt}",
        f"--val_src={val_src}",
        f"--val_tgt={val_tgt}",
    ]
    train = [
        f"--model_dir={run}",
        *corpus,
        *TINY_TRAIN_FLAGS,
        "--checkpoint_every=1",
        "--log_every=1",
    ]
    test_split = ["--dataset=files", f"--src_file={test_src}", f"--ref_file={test_tgt}"]
    export = [
        f"--model_dir={run}",
        f"--export_dir={exports}",
        "--nocheck_ops",
        "--sample=twenty one",
        "--warmup_sentences=twenty one",
    ]
    steps = [
        ("train.py", [*train, "--train_steps=1"]),
        # A full disk at the next save (a file-size limit below a checkpoint's data file, above the other files).
        ("train.py", [*train, "--train_steps=2"], {"file_size_limit": 100_000, "status": 1}),
        (
            "train.py",
            [*train, "--train_steps=2", "--verbosity=0"],
        ),  # the same command, with space: resumes
        ("average_checkpoints.py", [f"--model_dir={run}", "--last=2"]),
        (
            "evaluate.py",
            [f"--model_dir={run}", *test_split, "--average_last=2", f"--output={outputs}/hyp.txt"],
        ),
        (
            "translate.py",
            [f"--model_dir={run}", f"--input={test_src}", f"--output={outputs}/translations.txt"],
        ),
        # A full disk while the SavedModel is written: a limit above the tokenizer (copied into assets/) and the
        # variables, below saved_model.pb, written last.
        ("export.py", export, {"file_size_limit": 1_000_000, "status": 1}),
        ("export.py", export),  # the same command, with space: version 1
    ]
    result = run_sequence(steps, cwd=work)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "Traceback" not in output
    failed, failed_export = [line for line in output.splitlines() if line.startswith("error: ")]
    assert failed.startswith(f"error: Could not save checkpoint {run}/checkpoints/ckpt-2: ")
    assert failed.endswith(
        f"The last checkpoint, {run}/checkpoints/ckpt-1, and the state file are intact: run the "
        "same command to resume from it once the cause is fixed."
    )
    # It names the file that hit the limit, in the temporary directory beside the versions (now removed).
    assert failed_export.startswith(
        f"error: Could not export 'run' to {exports}/run: {store}/saved_models/run/.1.tmp-"
    )
    assert "/saved_model.pb" in failed_export
    assert failed_export.endswith(
        "; File too large. The partial export was removed and no version was published: run "
        "the same command once the cause is fixed."
    )
    assert f"Restored {run}/checkpoints/ckpt-1 at step 1" in output  # after the failed save
    assert f"Checkpoints: {run}/checkpoints/ckpt-2" in output
    assert f"Wrote {run}/averaged/ckpt-2" in output
    assert f"Exported {exports}/run/1" in output
    assert "Sample (loaded export): 'twenty one' -> " in output
    assert (
        f"MODEL_BASE_PATH={exports} -e MODEL_NAME=run" in output
    )  # TF Serving reads the URL itself

    for path in (
        "run/config.json",
        "run/spm.model",
        "run/checkpoints/checkpoint",
        "run/checkpoints/ckpt-2.index",
        "run/averaged/ckpt-2.index",
        "saved_models/run/1/saved_model.pb",
        "saved_models/run/models.config",
        "saved_models/run/1/assets.extra/tf_serving_warmup_requests",
    ):
        assert (store / path).is_file(), path
    assert list((store / "run" / "logs" / "train").glob("events.out.tfevents.*"))
    assert not list(
        (store / "run" / "checkpoints").glob("*_temp*")
    )  # nothing left of the failed save
    assert sorted(path.name for path in (store / "saved_models" / "run").iterdir()) == [
        "1",
        "models.config",
    ]
    assert [
        len((store / "out" / name).read_text().splitlines())
        for name in ("hyp.txt", "translations.txt")
    ] == [2, 2]
    assert list(work.iterdir()) == []  # nothing in the working directory (no "file:" directory)
    assert not [path for path in tmp_path.rglob("*") if path.name.startswith("file:")]
