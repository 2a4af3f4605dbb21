"""Settings and fixtures shared by every test module.

Keep this file generic: fixtures that belong to one concept live in that concept's test file.
"""

import ast
import fcntl
import os
import shutil
from pathlib import Path

# Before TensorFlow is first imported (test modules are imported after this file).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402

SHARED_DIR = Path(__file__).resolve().parents[2] / "shared"

# The slow tier (`-m slow`; the default command runs everything, `-m "not slow"` the fast tier):
# whole modules that run scripts or second processes, train, export, benchmark or load clean
# runtimes, and the single tests of other modules that take several seconds each.
SLOW_MODULES = (
    "test_accelerator",
    "test_backends",
    "test_benchmark",
    "test_cpu_allocator",
    "test_ctranslate2",
    "test_distributed_docs",
    "test_docstrings",
    "test_equivalence",
    "test_experiments_decode",
    "test_experiments_parse",
    "test_experiments_train",
    "test_export",
    "test_faults",
    "test_fs",
    "test_layers_saved_model",
    "test_pretrained_scripts",
    "test_publishing",
    "test_quantization",
    "test_run_ownership",
    "test_scale",
    "test_serving_docs",
)
SLOW_TESTS = (
    "test_cli.py::test_help_lists_every_documented_flag",
    "test_cli.py::test_help_prints_no_tensorflow_start_up_lines",
    "test_decoding.py::test_copy_model_ends_sentences",
    "test_decoding.py::test_mixed_length_batch_equals_one_at_a_time",
    "test_decoding.py::test_search_runs_in_a_saved_model",
    "test_decoding.py::test_xla_matches_graph_and_eager",
    "test_decoding.py::test_xla_recompute_baseline",
    "test_evaluation.py::test_evaluate_run_with_an_ensemble_searches_with_both_models",
    "test_evaluation.py::test_evaluate_saved_model",
    "test_evaluation.py::test_score_checkpoints_scores_each_step_as_evaluate_run_would_have_then",
    "test_evaluation.py::test_xla_decoding_benchmark_pads_widths_and_matches_graph_mode",
    "test_flag_file.py::test_train_flag_file_reruns_the_same_run_elsewhere",
    "test_marian_tokenizer.py::test_a_saved_model_keeps_both_models_apart_and_has_servable_ops",
    "test_marian_tokenizer.py::test_export_of_a_run_with_the_pair_answers_text_in_a_clean_runtime",
    "test_multi_worker_score.py::test_two_workers_log_the_chiefs_scores_at_the_same_steps",
    "test_pretrained.py::test_beam_search_returns_their_generate_ids",
    "test_pretrained.py::test_greedy_search_returns_their_generate_ids",
    "test_search_options.py::test_evaluate_script_decodes_with_the_run_config",
    "test_shortlist.py::test_ctranslate2_vmap_file_is_the_same_shortlist",
    "test_shortlist.py::test_int8_shortlist_of_every_token_is_the_exact_search",
    "test_shortlist.py::test_saved_model_with_a_map_translates_as_the_step",
    "test_shortlist.py::test_separate_run_map_and_ctranslate2_vmap",
    "test_streaming.py::test_a_script_stopping_while_its_input_stays_open_exits_with_its_status",
    "test_streaming.py::test_translate_answers_each_stdin_line_before_the_next",
    "test_streaming.py::test_translate_nbest_larger_than_the_beam_is_one_line",
    "test_streaming.py::test_translate_nbest_prints_k_sorted_hypotheses_per_line",
    "test_training.py::test_averaging_two_checkpoints_gives_the_mean",
    "test_training.py::test_embedded_task_run_lowers_validation_loss",
    "test_training.py::test_interrupted_run_with_dropout_equals_uninterrupted_run",
    "test_training.py::test_nan_loss_stops_with_step_and_keeps_last_checkpoint",
    "test_training.py::test_nonfinite_gradient_under_finite_loss_stops_before_the_update",
    "test_training.py::test_plain_model_fit_trains",
    "test_training.py::test_precisions_and_xla_train",
    "test_training.py::test_rerun_resumes_step_count",
    "test_training.py::test_several_updates_per_call_equal_one_per_call",
    "test_training.py::test_skipped_nonfinite_update_changes_nothing_and_is_counted",
    "test_training_score.py::test_best_checkpoint_and_patience_count_scored_evaluations_across_resumes",
    "test_training_score.py::test_a_run_scored_by_decoding_keeps_the_best_and_best_reproduces_its_score",
    "test_training_score.py::test_train_script_scores_under_mirrored_replicas_and_translate_reads_best",
    "test_training_score.py::test_a_parsing_run_is_scored_with_evalb_f1_and_tagging_accuracy",
    "test_parsing_model.py::test_cached_searches_equal_the_recomputed_ones",
    "test_transformer.py::test_skipping_padding_equals_the_padded_model",
    "test_tree_constraint.py::test_word_position_model_decodes_step_by_step_as_the_full_model",
    "test_windowed_attention.py::test_windowed_cached_decoding_keeps_r_slots_and_equals_the_full_pass",
    "test_windowed_attention.py::test_windowed_model_trains_in_fit",
)

# The modules that take minutes on 2 cores, longest first (a full run's `--durations=0`, summed
# per module). Under `-n 2 --dist loadfile` a worker takes one whole module at a time, in this
# order, then the rest in collection order: a long module started last would leave the other
# worker idle while it runs.
LONGEST_FIRST = (
    "test_scale",
    "test_benchmark",
    "test_export",
    "test_faults",
    "test_backends",
    "test_equivalence",
    "test_training",
    "test_experiments_parse",
    "test_decoding",
    "test_run_ownership",
    "test_training_score",
    "test_pretrained_scripts",
    "test_experiments_train",
    "test_quantization",
    "test_evaluation",
    "test_docstrings",
    "test_fs",
)


def stale_slow_entries(tests_dir=Path(__file__).parent, modules=SLOW_MODULES, tests=SLOW_TESTS):
    """The entries of `modules` and `tests` that name nothing: one line each.

    A module is a file `tests_dir/<module>.py`; a test id `file.py::name` (or
    `file.py::Class::name`) names a function or class of that file, found by reading its source.
    """
    stale = [
        f"SLOW_MODULES names {module}, but tests/{module}.py does not exist"
        for module in modules
        if not (tests_dir / f"{module}.py").is_file()
    ]
    for test in tests:
        file, *names = test.split("::")
        if not (tests_dir / file).is_file():
            stale.append(f"SLOW_TESTS names {test}, but tests/{file} does not exist")
            continue
        body = ast.parse((tests_dir / file).read_text(encoding="utf-8")).body
        for name in names:
            found = [
                node
                for node in body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node.name == name
            ]
            if not found:
                stale.append(f"SLOW_TESTS names {test}, but tests/{file} defines no {name}")
                break
            body = found[0].body
    return stale


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep LONGEST_FIRST's order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {module: index for index, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.nodeid.partition("::")[0]).stem, len(rank)))
    for item in items:
        module, _, name = item.nodeid.partition("::")
        if (
            Path(module).stem in SLOW_MODULES
            or f"{Path(module).name}::{name.split('[')[0]}" in SLOW_TESTS
        ):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def absl_verbosity():
    """Sets absl's verbosity for a test (`set(level)`), and restores it after."""
    from absl import logging as absl_logging

    before = absl_logging.get_verbosity()
    yield absl_logging.set_verbosity
    absl_logging.set_verbosity(before)


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


def made_once(tmp_path_factory, name, make):
    """`<folder>/name`, made by `make(path)` once for the whole test session: under pytest-xdist
    the workers share it (the first makes it under a lock, the others wait for it and read it);
    without xdist it is in the session's own temporary folder."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)  # left by a worker that failed making it
            path.mkdir()
            make(path)
            done.touch()
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A run directory trained on the embedded task by the real training code.

    Holds `config.json`, `spm.model` and `checkpoints/` (steps 60 and 120). Shared by the
    decoding, evaluation, visualization and export tests; treat it as read-only.
    """
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import DataOptions, TrainOptions, train_translation

    def train(run_dir):
        config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=TRAINED_RUN_STEPS)
        options = TrainOptions(
            batch_tokens=1024, checkpoint_every=60, eval_every=0, log_every=60, progress=False
        )
        train_translation(config, run_dir, options, DataOptions("builtin"))

    return made_once(tmp_path_factory, "trained_run", train)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """The `spm.model` of a fresh built-in run of `tests.scripts.TINY_TRAIN_FLAGS`, trained once
    per session (`tests.scripts.train_tiny_tokenizer`); copy it with `tests.scripts.seed_tokenizer`."""
    from keras_transformer.runs import tokenizer_path
    from tests.scripts import train_tiny_tokenizer

    return Path(tokenizer_path(made_once(tmp_path_factory, "tiny_tokenizer", train_tiny_tokenizer)))


@pytest.fixture(scope="module")
def run_model(trained_run):
    """`(model, tokenizer, config)` of `trained_run`, loaded once per test module."""
    from keras_transformer.training import load_run

    return load_run(trained_run)
