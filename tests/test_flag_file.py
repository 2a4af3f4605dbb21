"""A run reproduces from one file: train.py writes its flags as RUN/flags.txt, and
`train.py --flagfile=RUN/flags.txt` trains the same run (`cli.flag_file`, `runs.write_flag_file`)."""

import json
import sys

from absl import flags

from keras_transformer import cli
from keras_transformer.runs import flags_path, write_flag_file
from tests.scripts import TINY_TRAIN_FLAGS, run_script


def _flag_values():
    flag_values = flags.FlagValues()
    define = dict(flag_values=flag_values, module_name=sys.argv[0])
    flags.DEFINE_string("model_dir", None, "Run.", **define)
    flags.DEFINE_string("data_dir", "a b/c", "A path with a space.", **define)
    flags.DEFINE_list("devices", None, "Devices.", **define)
    flags.DEFINE_bool("progress", True, "Bar.", **define)
    flags.DEFINE_float("dropout", 0.1, "Rate.", **define)
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_float16"], "Dtype.", **define)
    flags.DEFINE_integer("other", 1, "Another library's.", flag_values=flag_values, module_name="x")
    return flag_values


def test_flag_file_reads_back_as_the_same_values(tmp_path):
    source = _flag_values()
    source(["train.py", "--devices=0,1", "--noprogress", "--dropout=0.25", "--other=5"])
    path = tmp_path / "flags.txt"
    path.write_text(cli.flag_file("train.py", source, model_dir="runs/a"), encoding="utf-8")
    target = _flag_values()
    target(["train.py", f"--flagfile={path}", "--dropout=0.5"])  # a flag after the file wins
    assert target.model_dir == "runs/a" and target.data_dir == "a b/c"
    assert target.devices == ["0", "1"] and target.progress is False
    assert target.precision == "float32" and target.dropout == 0.5
    assert target.other == 1  # only the script's and the package's flags are written
    assert "--other" not in path.read_text(encoding="utf-8")


def test_flag_file_is_rewritten_only_when_it_changes(tmp_path):
    assert write_flag_file(tmp_path, "--seed=1\n") == (True, None)
    assert write_flag_file(tmp_path, "--seed=1\n") == (False, "--seed=1\n")
    assert write_flag_file(tmp_path, "--seed=2\n") == (True, "--seed=1\n")
    assert flags_path(tmp_path).read_text(encoding="utf-8") == "--seed=2\n"


def test_train_flag_file_reruns_the_same_run_elsewhere(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run_script(
        "train.py",
        *TINY_TRAIN_FLAGS,
        "--train_steps=2",
        "--checkpoint_every=2",
        "--seed=3",
        "--dropout=0.2",
        "--label_smoothing=0.05",
        f"--model_dir={first}",
    )
    flag_file = flags_path(first)
    args = flags.FlagValues().read_flags_from_files([f"--flagfile={flag_file}"])
    assert f"--model_dir={first}" in args and "--seed=3" in args and "--hidden_dim=32" in args
    run_script("train.py", f"--flagfile={flag_file}", f"--model_dir={second}")
    config = json.loads((first / "config.json").read_text(encoding="utf-8"))
    assert json.loads((second / "config.json").read_text(encoding="utf-8")) == config
    assert config["model"]["hidden_dim"] == 32 and config["training"]["seed"] == 3
    assert flags_path(second).read_text(encoding="utf-8") == flag_file.read_text(
        encoding="utf-8"
    ).replace(f"--model_dir={first}\n", f"--model_dir={second}\n")

    # A refused start (another architecture) leaves the run's flags alone.
    before = flag_file.read_text(encoding="utf-8")
    refused = run_script("train.py", f"--flagfile={flag_file}", "--hidden_dim=48", check=False)
    assert refused.returncode == 1 and "different architecture" in refused.stderr
    assert flag_file.read_text(encoding="utf-8") == before

    # A resume with other flags records them (and says what changed).
    resumed = run_script("train.py", f"--flagfile={flag_file}", "--train_steps=3")
    assert "Flags changed since the previous start (---train_steps=2 +--train_steps=3)" in (
        resumed.stderr
    )
    assert flag_file.read_text(encoding="utf-8") == before.replace(
        "--train_steps=2\n", "--train_steps=3\n"
    )
