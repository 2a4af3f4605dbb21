"""Tests for keras_transformer.data.trees and data.treebank: reading, cleaning, linearization, splits."""

import pytest

from keras_transformer.data.treebank import (
    load_ptb_pairs,
    read_split,
    read_treebank_file,
    split_files,
)
from keras_transformer.data.trees import (
    TreeError,
    clean,
    delinearize,
    linearize,
    parse_tree,
    read_trees,
    right_branching,
    sentence_words,
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
    return [
        tree for split in ("train", "val", "test") for tree in read_split(ptb_sample_dir, split)
    ]


def test_cleaning_removes_empty_elements_and_function_tags(tmp_path):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(MRG)
    first, second = read_treebank_file(path)
    assert str(first) == (
        "(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) "
        "(PRN (-LRB- -LRB-) (NN sic) (-RRB- -RRB-)) (. .)))"
    )
    assert str(second) == "(TOP (S (VP (VB go))))"  # the subject NP was only an empty element
    assert [
        strip_function_tags(label) for label in ("NP-SBJ-1", "PP-LOC=2", "-NONE-", "-LRB-", "PRP$")
    ] == ["NP", "PP", "-NONE-", "-LRB-", "PRP$"]
    assert clean(parse_tree("( (S (NP (-NONE- *)) ) )")) is None


def test_linearization_example():
    tree = parse_tree(
        "(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .)))"
    )
    assert linearize(tree) == (
        "Ms. Haag plays Elianti .",
        "(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )",
    )
    assert (
        delinearize("(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )", "Ms. Haag plays Elianti .") == tree
    )


def test_round_trip_of_every_sample_tree(sample_trees):
    assert len(sample_trees) == 3501
    for tree in sample_trees:
        source, target = linearize(tree)
        assert source.split() == sentence_words(source) == tree.words()
        assert delinearize(target, source) == tree, str(tree)
        # words are left out: the target is symbols only, one tag per word
        tags = [symbol for symbol in target.split() if symbol != ")" and not symbol.startswith("(")]
        assert tags == [tag for tag, _ in tree.tagged_words()]


# Crafted lines and their words: every character `str.split()` splits at separates words (tab,
# NBSP, U+0085, U+3000, U+001C), nothing else does (U+200B, U+2581 "▁", U+FFFD stay in words).
WORD_CASES = [
    ("a \u200b b", ["a", "\u200b", "b"]),
    ("a \x85 b", ["a", "b"]),
    ("a\u2581b c", ["a\u2581b", "c"]),
    ("a \ufffd b", ["a", "\ufffd", "b"]),
    ("a\u00a0b\tc\u3000d\x1ce ", ["a", "b", "c", "d", "e"]),
    ("He said ( yes ) .", ["He", "said", "-LRB-", "yes", "-RRB-", "."]),
    ("f(x) :)", ["f-LRB-x-RRB-", ":-RRB-"]),
    ("-LRB- x -RRB-", ["-LRB-", "x", "-RRB-"]),
]


@pytest.mark.parametrize("line, words", WORD_CASES)
def test_sentence_words(line, words):
    assert sentence_words(line) == words


def test_brackets_in_words_are_written_as_the_treebank_writes_them_and_read_back():
    """A word `(` or `)` (or one holding them) is written -LRB- / -RRB-, so the one-line tree reads
    back as the same tree, with the line's words."""
    line = "He said ( yes ) :)"
    tree = delinearize("(S NN VBD (PRN -LRB- UH -RRB- ) . )", line)
    assert (
        str(tree)
        == "(TOP (S (NN He) (VBD said) (PRN (-LRB- -LRB-) (UH yes) (-RRB- -RRB-)) (. :-RRB-)))"
    )
    assert parse_tree(str(tree)) == tree and tree.words() == sentence_words(line)
    assert (
        delinearize("(S NN VBD (PRN -LRB- UH -RRB- ) . )", line.split()) == tree
    )  # words as a list too


@pytest.mark.parametrize(
    "target", ["(S NN", "(S NN ) )", "(S ) NN", "NN NN NN", "(S (NP ) NN NN )"]
)
def test_delinearize_rejects_malformed_targets(target):
    with pytest.raises(TreeError):
        delinearize(target, "a b")


def test_tree_symbols_cover_the_treebank_and_the_data():
    symbols = tree_symbols(["(S (ADVP|PRT RB ) NEWTAG )"])
    assert {")", "(S", "(NP", "(ADVP|PRT", "NN", "-LRB-", "NEWTAG"} <= set(symbols)
    assert len(symbols) == len(set(symbols))


def test_right_branching():
    assert (
        str(right_branching(["a", "b", "c"], ["DT", "NN", "."]))
        == "(TOP (S (DT a) (S (NN b) (S (. c)))))"
    )


def test_flat_directory_split(ptb_sample_dir):
    names = {
        split: [path.name for path in split_files(ptb_sample_dir, split)]
        for split in ("train", "val", "test")
    }
    assert (names["val"][0], names["val"][-1]) == ("wsj_0136.mrg", "wsj_0152.mrg")
    assert (names["test"][0], names["test"][-1]) == ("wsj_0153.mrg", "wsj_0169.mrg")
    assert len(names["train"]) == 135
    chosen = {
        split: [path.name for path in split_files(ptb_sample_dir, split, "wsj_015*", "wsj_016*")]
        for split in ("train", "val", "test")
    }
    assert chosen["val"] == [f"wsj_015{i}.mrg" for i in range(10)]
    assert chosen["test"] == [f"wsj_016{i}.mrg" for i in range(10)]
    assert len(chosen["train"]) == 149


def test_section_folders_get_the_standard_split(tmp_path):
    for section in ("02", "21", "22", "23", "24"):
        name = f"wsj_{section}01"
        (tmp_path / section).mkdir()
        (tmp_path / section / f"{name}.mrg").write_text(f"( (S (NN w{section}) ) )\n")
    pairs = {split: load_ptb_pairs(tmp_path, split) for split in ("train", "val", "test")}
    assert pairs == {
        "train": [("w02", "(S NN )"), ("w21", "(S NN )")],
        "val": [("w22", "(S NN )")],
        "test": [("w23", "(S NN )")],
    }


@pytest.mark.parametrize(
    "text, line",
    [
        ("( (S (NN a) )\n( (S (NN b) ) )\n", 1),  # not closed
        ("( (S (NN a) ) )\n\n( (S (NN b) ) ) )\n", 3),  # one closing bracket too many
        ("( (S (NN a) ) )\n( (S (NN b c) ) )\n", 2),  # two words under one tag
        ("( (S (NN a) ) )\nword ( (S (NN b) ) )\n", 2),  # a word outside a tree
        ("( (S (NN a) ) )\n( (S () ) )\n", 2),  # an empty bracket
    ],
)
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


def test_the_export_splits_words_in_the_graph_as_sentence_words():
    """`export.parser.sentence_words_in_graph` (TensorFlow ops) gives `sentence_words` on the crafted
    lines, on every whitespace character of `str.split()` between and around words, and on random
    strings of whitespace, brackets and characters that are not whitespace."""
    import random
    import sys

    import tensorflow as tf

    from keras_transformer.export.parser import sentence_words_in_graph

    spaces = [chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()]
    lines = [line for line, _ in WORD_CASES] + [f"{space}a{space}(b{space}" for space in spaces]
    alphabet = spaces + [
        "a",
        "(",
        ")",
        "\u200b",
        "\u2581",
        "\ufffd",
        "\x00",
        "\u180e",
        "\ufeff",
        "\u2603",
        "é",
    ]
    rng = random.Random(0)
    lines += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10))) for _ in range(300)]
    in_graph = sentence_words_in_graph(tf.constant(lines)).to_list()
    assert [[word.decode() for word in words] for words in in_graph] == [
        sentence_words(line) for line in lines
    ]


def test_the_export_writes_a_tree_only_over_every_word():
    """The export's tree writer equals `delinearize`, and writes "" rather than a tree over other
    words when the tags and words differ in number (a sentence cut to the model's length)."""
    import tensorflow as tf

    from keras_transformer.export.parser import trees_from_targets

    target, line = "(S NN VBD (PRN -LRB- UH -RRB- ) . )", "He\tsaid ( yes ) :)"
    targets = [target, "(S NN VBD . )", target, ""]
    lines = [line, line, "He said ( yes )", line]
    trees = [
        tree.decode()
        for tree in trees_from_targets(tf.constant(targets), tf.constant(lines)).numpy()
    ]
    assert trees == [str(delinearize(target, line)), "", "", ""]
