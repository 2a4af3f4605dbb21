"""Tests for keras_transformer.data.trees and data.treebank: reading, cleaning, linearization, splits."""

import pytest

from keras_transformer.data.treebank import load_ptb_pairs, read_split, read_treebank_file, split_files
from keras_transformer.data.trees import (
    TreeError,
    clean,
    delinearize,
    linearize,
    parse_tree,
    read_trees,
    right_branching,
    strip_function_tags,
    tree_symbols,
)

MRG = """\
( (S
    (NP-SBJ-1 (NNP Ms.) (NNP Haag) )
    (VP (VBZ plays)
      (NP (-NONE- *-1) )
      (NP (NNP Elianti) ))
    (PRN (-LRB- -LRB-) (NN sic) (-RRB- -RRB-) )
    (. .) ))
( (S (NP-SBJ (-NONE- *) ) (VP (VB go) ) ) )
"""


@pytest.fixture(scope="module")
def sample_trees(ptb_sample_dir):
    return [tree for split in ("train", "val", "test") for tree in read_split(ptb_sample_dir, split)]


def test_cleaning_removes_empty_elements_and_function_tags(tmp_path):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(MRG)
    first, second = read_treebank_file(path)
    assert str(first) == (
        "(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) "
        "(PRN (-LRB- -LRB-) (NN sic) (-RRB- -RRB-)) (. .)))"
    )
    assert str(second) == "(TOP (S (VP (VB go))))"  # the subject NP was only an empty element
    assert [strip_function_tags(label) for label in ("NP-SBJ-1", "PP-LOC=2", "-NONE-", "-LRB-", "PRP$")] == [
        "NP", "PP", "-NONE-", "-LRB-", "PRP$"]
    assert clean(parse_tree("( (S (NP (-NONE- *)) ) )")) is None


def test_linearization_example():
    tree = parse_tree("(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .)))")
    assert linearize(tree) == ("Ms. Haag plays Elianti .", "(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )")
    assert delinearize("(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )", "Ms. Haag plays Elianti .") == tree


def test_round_trip_of_every_sample_tree(sample_trees):
    assert len(sample_trees) == 3501
    for tree in sample_trees:
        source, target = linearize(tree)
        assert source.split() == tree.words()
        assert delinearize(target, source) == tree, str(tree)
        # words are left out: the target is symbols only, one tag per word
        tags = [symbol for symbol in target.split() if symbol != ")" and not symbol.startswith("(")]
        assert tags == [tag for tag, _ in tree.tagged_words()]


@pytest.mark.parametrize("target", ["(S NN", "(S NN ) )", "(S ) NN", "NN NN NN", "(S (NP ) NN NN )"])
def test_delinearize_rejects_malformed_targets(target):
    with pytest.raises(TreeError):
        delinearize(target, "a b")


def test_tree_symbols_cover_the_treebank_and_the_data():
    symbols = tree_symbols(["(S (ADVP|PRT RB ) NEWTAG )"])
    assert {")", "(S", "(NP", "(ADVP|PRT", "NN", "-LRB-", "NEWTAG"} <= set(symbols)
    assert len(symbols) == len(set(symbols))


def test_right_branching():
    assert str(right_branching(["a", "b", "c"], ["DT", "NN", "."])) == "(TOP (S (DT a) (S (NN b) (S (. c)))))"


def test_flat_directory_split(ptb_sample_dir):
    names = {split: [path.name for path in split_files(ptb_sample_dir, split)] for split in ("train", "val", "test")}
    assert (names["val"][0], names["val"][-1]) == ("wsj_0136.mrg", "wsj_0152.mrg")
    assert (names["test"][0], names["test"][-1]) == ("wsj_0153.mrg", "wsj_0169.mrg")
    assert len(names["train"]) == 135
    chosen = {split: [path.name for path in split_files(ptb_sample_dir, split, "wsj_015*", "wsj_016*")]
              for split in ("train", "val", "test")}
    assert chosen["val"] == [f"wsj_015{i}.mrg" for i in range(10)]
    assert chosen["test"] == [f"wsj_016{i}.mrg" for i in range(10)]
    assert len(chosen["train"]) == 149


def test_section_folders_get_the_standard_split(tmp_path):
    for section in ("02", "21", "22", "23", "24"):
        name = f"wsj_{section}01"
        (tmp_path / section).mkdir()
        (tmp_path / section / f"{name}.mrg").write_text(f"( (S (NN w{section}) ) )\n")
    pairs = {split: load_ptb_pairs(tmp_path, split) for split in ("train", "val", "test")}
    assert pairs == {"train": [("w02", "(S NN )"), ("w21", "(S NN )")], "val": [("w22", "(S NN )")],
                     "test": [("w23", "(S NN )")]}


@pytest.mark.parametrize("text, line", [
    ("( (S (NN a) )\n( (S (NN b) ) )\n", 1),  # not closed
    ("( (S (NN a) ) )\n\n( (S (NN b) ) ) )\n", 3),  # one closing bracket too many
    ("( (S (NN a) ) )\n( (S (NN b c) ) )\n", 2),  # two words under one tag
    ("( (S (NN a) ) )\nword ( (S (NN b) ) )\n", 2),  # a word outside a tree
    ("( (S (NN a) ) )\n( (S () ) )\n", 2),  # an empty bracket
])
def test_malformed_files_name_the_file_and_line(tmp_path, text, line):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(text)
    with pytest.raises(TreeError, match=rf"^{path}:{line}: "):
        read_treebank_file(path)
    assert len(str(pytest.raises(TreeError, read_treebank_file, path).value).splitlines()) == 1


def test_a_malformed_file_stops_the_split(tmp_path):
    (tmp_path / "wsj_0001.mrg").write_text("( (S (NN a) ) )\n")
    (tmp_path / "wsj_0002.mrg").write_text("( (S (NN a) ) \n")
    with pytest.raises(TreeError, match="wsj_0002.mrg:1: "):
        load_ptb_pairs(tmp_path, "test", val_files="wsj_0001*", test_files="wsj_0002*")


def test_read_trees_keeps_line_numbers():
    assert [line for line, _ in read_trees(MRG)] == [1, 8]
