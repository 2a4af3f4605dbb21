"""experiments/import_model.py and the scripts on the run it writes: translate.py, train.py
(fine-tuning), export.py (SavedModel, CTranslate2, transformers). Slow tier: real processes."""

import json
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.scripts import run_script  # noqa: E402
from tests.test_pretrained import SOURCES, write_marian_directory  # noqa: E402

FINE_TUNE_STEPS = 30


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory, multi30k_dir):
    return write_marian_directory(tmp_path_factory.mktemp("marian"), multi30k_dir)


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "opus"
    result = run_script("import_model.py", f"--from={marian_dir}", f"--model_dir={run}")
    assert f"Imported {marian_dir} into {run}" in result.stdout
    return run


def _their_text(marian_dir, sources, **settings):
    """transformers' translations of `sources`, one at a time with our length limit (source
    tokens + the run's max_output_offset), no EOS forced at the limit."""
    model = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(marian_dir))
    texts = []
    for source in sources:
        inputs = tokenizer([source], return_tensors="pt")
        with torch.no_grad():
            generated = model.generate(
                **inputs,
                max_new_tokens=inputs["input_ids"].shape[1] + 50,
                forced_eos_token_id=None,
                early_stopping=False,
                **settings,
            )
        texts.append(tokenizer.decode(generated[0], skip_special_tokens=True))
    return texts


def test_translate_prints_the_translations_of_transformers(marian_dir, imported):
    result = run_script(
        "translate.py",
        f"--model_dir={imported}",
        "--method=greedy",
        stdin="\n".join(SOURCES) + "\n",
    )
    assert result.stdout.splitlines() == _their_text(marian_dir, SOURCES, num_beams=1)


def test_import_errors_are_one_line(marian_dir, tmp_path):
    missing = run_script(
        "import_model.py",
        f"--from={tmp_path / 'nowhere'}",
        f"--model_dir={tmp_path / 'run'}",
        check=False,
    )
    assert missing.returncode == 1
    assert (
        missing.stderr.strip().splitlines()[-1]
        == f"error: No such directory: {tmp_path / 'nowhere'}"
    )
    config = json.loads((marian_dir / "config.json").read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in marian_dir.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (broken / "config.json").write_text(json.dumps({**config, "normalize_before": True}))
    refused = run_script(
        "import_model.py", f"--from={broken}", f"--model_dir={tmp_path / 'run'}", check=False
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {broken / 'config.json'}: normalize_before=True is not supported: our Marian "
        "models have normalize_before=false"
    )


def _embedding(run, step):
    """The token embedding of checkpoint `ckpt-<step>` of `run`."""
    from keras_transformer.runs import load_run

    model = load_run(run, checkpoint=str(run / "checkpoints" / f"ckpt-{step}"))[0]
    return model.source_embedding.embeddings.numpy()


def test_train_fine_tunes_the_import_from_step_0(imported, tmp_path, multi30k_dir):
    """train.py --flagfile=RUN/flags.txt: the weights of ckpt-0, no optimizer state, the schedule
    from step 0; the validation loss falls."""
    from keras_transformer.data.corpus import load_multi30k

    run = tmp_path / "run"
    shutil.copytree(imported, run)
    for split, count in (("train", 300), ("val", 50)):
        pairs = load_multi30k("en", "de", split, data_dir=multi30k_dir)[:count]
        for side, language in ((0, "en"), (1, "de")):
            (tmp_path / f"{split}.{language}").write_text(
                "".join(pair[side] + "\n" for pair in pairs)
            )
    result = run_script(
        "train.py",
        f"--flagfile={run}/flags.txt",
        f"--model_dir={run}",  # flags.txt names the directory imported into
        "--dataset=files",
        *(
            f"--{split}_{side}={tmp_path}/{split}.{language}"
            for split in ("train", "val")
            for side, language in (("src", "en"), ("tgt", "de"))
        ),
        f"--train_steps={FINE_TUNE_STEPS}",
        "--warmup_steps=10",
        "--learning_rate_scale=0.1",  # a fine-tuning rate (docs/pretrained.md)
        "--eval_every=10",
        "--log_every=10",
        f"--checkpoint_every={FINE_TUNE_STEPS}",
        "--batch_tokens=512",
        "--noprogress",
    )
    assert "Restored" in result.stderr and "ckpt-0 at step 0" in result.stderr
    # An import's checkpoint is not an older one: it holds the weights and nothing more, by design.
    assert "ckpt-0 holds the model's weights only (no optimizer state)" in result.stderr
    assert "older checkpoint" not in result.stderr
    starts = [json.loads(line) for line in (run / "starts.jsonl").read_text().splitlines()]
    assert [start["step"] for start in starts] == [0]
    losses = [
        float(loss) for loss in re.findall(r"step \d+ validation loss ([\d.]+)", result.stderr)
    ]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    before, after = _embedding(run, 0), _embedding(run, FINE_TUNE_STEPS)
    assert not np.allclose(before, after)
    # Moved from the import (a model trained from a fresh initialisation: about 0).
    assert np.corrcoef(before.ravel(), after.ravel())[0, 1] > 0.5


def test_exports_of_the_import_translate_as_the_run(marian_dir, imported, tmp_path):
    source = SOURCES[1]
    ours = run_script("translate.py", f"--model_dir={imported}", stdin=source + "\n").stdout.strip()
    saved = run_script(
        "export.py", f"--model_dir={imported}", f"--export_dir={tmp_path}", f"--sample={source}"
    )
    assert f"Sample (loaded export): {source!r} -> {ours!r}" in saved.stdout
    ct2 = run_script(
        "export.py",
        f"--model_dir={imported}",
        "--format=ctranslate2",
        f"--export_dir={tmp_path / 'ct2'}",
        f"--sample={source}",
    )
    assert "Sample (loaded export)" in ct2.stdout
    exported = run_script(
        "export.py",
        f"--model_dir={imported}",
        "--format=transformers",
        f"--export_dir={tmp_path / 'hf'}",
        f"--sample={source}",
    )
    assert f"Exported {tmp_path / 'hf' / imported.name} (transformers" in exported.stdout
    assert f"Sample (loaded export): {source!r} -> " in exported.stdout
