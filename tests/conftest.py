"""Settings and fixtures shared by every test module.

Keep this file generic: fixtures that belong to one concept live in that concept's test file.
"""

import os
from pathlib import Path

# Before TensorFlow is first imported (test modules are imported after this file).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402

SHARED_DIR = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def multi30k_dir():
    """The shared Multi30k corpus directory (`train.en.gz`, `val.de.gz`, ...); the one way tests reach it.

    Skips the test, saying where it looked, when the shared data is not beside the repository.
    """
    path = SHARED_DIR / "data" / "multi30k"
    if not path.is_dir():
        pytest.skip(f"the shared Multi30k copy is not at {path}")
    return path


def _shared_data(name):
    path = SHARED_DIR / "data" / name
    if not path.is_dir():
        pytest.skip(f"the shared {name} copy is not at {path}")
    return path


@pytest.fixture(scope="session")
def ptb_sample_dir():
    """The shared Penn Treebank sample (flat `wsj_0001.mrg` ... `wsj_0169.mrg`); skips when absent."""
    return _shared_data("ptb-sample")


@pytest.fixture(scope="session")
def evalb_sample_dir():
    """EVALB's reference cases (`sample.gld`/`.tst`/`.prm`/`.rsl`, `ptb5.*`, `COLLINS.prm`); skips when absent."""
    return _shared_data("evalb-sample")


# A small configuration that trains in seconds on the embedded task (the tokenizer needs
# at least ~100 pieces for its words).
TRAINED_RUN_CONFIG = dict(
    vocabulary_size=128,
    num_encoder_layers=2,
    num_decoder_layers=2,
    hidden_dim=64,
    intermediate_dim=128,
    num_heads=4,
    max_length=48,
    warmup_steps=60,
)
TRAINED_RUN_STEPS = 120


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A run directory trained on the embedded task by the real training code.

    Holds `config.json`, `spm.model` and `checkpoints/` (steps 60 and 120). Shared by the
    decoding, evaluation, visualization and export tests; treat it as read-only.
    """
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import DataOptions, TrainOptions, train_translation

    run_dir = tmp_path_factory.mktemp("trained_run")
    config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=TRAINED_RUN_STEPS)
    options = TrainOptions(batch_tokens=1024, checkpoint_every=60, eval_every=0, log_every=60, progress=False)
    train_translation(config, run_dir, options, DataOptions("builtin"))
    return run_dir


@pytest.fixture(scope="module")
def run_model(trained_run):
    """`(model, tokenizer, config)` of `trained_run`, loaded once per test module."""
    from keras_transformer.training import load_run

    return load_run(trained_run)
