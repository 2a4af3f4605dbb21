"""Tests for keras_transformer.decoding.tree_constraint and decoding.parser: every output is a tree."""

import keras
import numpy as np
import pytest

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_sentencepiece
from keras_transformer.data.treebank import load_ptb_pairs
from keras_transformer.data.trees import delinearize, parse_tree, tree_symbols
from keras_transformer.decoding import Parser, TreeConstraint, make_search_fn
from keras_transformer.decoding.tree_constraint import CLOSING, END, OPEN, OTHER, TAG
from keras_transformer.models.config import get_preset
from keras_transformer.models.transformer import Transformer

# A toy vocabulary: 0 PAD, 1 UNK, 2 BOS, 3 EOS, 4 "(S", 5 ")", 6 "NN", 7 a word piece "▁x", 8 "y" (no word start)
KINDS = [OTHER, OTHER, OTHER, END, OPEN, CLOSING, TAG, OTHER, OTHER]
STARTS = [0, 0, 0, 0, 1, 1, 1, 1, 0]


def _allowed(prefix, words=2, limit=20):
    constraint = TreeConstraint(KINDS, STARTS)
    ids = [[BOS_ID, *prefix, *[PAD_ID] * (limit - len(prefix))]]
    allowed = constraint.allowed(ids, len(prefix), [words], [limit]).numpy()[0]
    return {i for i in range(len(KINDS)) if allowed[i]}


def test_source_words_count_word_start_pieces():
    constraint = TreeConstraint(KINDS, STARTS)
    assert constraint.source_words([[7, 8, 7, 3, 0], [7, 3, 0, 0, 0]]).numpy().tolist() == [2, 1]


def test_mask_rules():
    assert _allowed([]) == {4, 6}  # open or tag; no ")" without "(", no EOS before the words
    assert _allowed([4]) == {4, 6}  # no empty constituent
    assert _allowed([4, 6]) == {4, 5, 6}
    assert _allowed([4, 6, 6]) == {5}  # both tags out: close what is open
    assert _allowed([4, 6, 6, 5]) == {EOS_ID}
    assert _allowed([6, 6]) == {EOS_ID}  # a complete (flat) tree
    # the length limit: after "(S NN" with 2 slots left after the next symbol, one word and one
    # bracket still to go, there is no room to open another constituent
    assert _allowed([4, 6], words=2, limit=5) == {5, 6}
    assert _allowed([4, 4], words=2, limit=7) == {6}  # "(S (S" + tag tag ) ) EOS fills the 7 slots


@pytest.fixture(scope="module")
def untrained_parser(tmp_path_factory, ptb_sample_dir):
    """A tokenizer with the tree symbols (trained on a few sample files) and an untrained model."""
    keras.utils.set_random_seed(0)  # the untrained outputs must not depend on what ran before
    pairs = load_ptb_pairs(ptb_sample_dir, "train", test_files="wsj_001*,wsj_01[1-6]*")[:400]
    path = tmp_path_factory.mktemp("tree_tokenizer") / "spm.model"
    train_sentencepiece([text for pair in pairs for text in pair], path, 600,
                        whole_words=tree_symbols(target for _, target in pairs))
    tokenizer = Tokenizer(path)
    model = Transformer(get_preset("tiny", vocabulary_size=600, num_encoder_layers=1, num_decoder_layers=1,
                                   hidden_dim=32, intermediate_dim=64, num_heads=2))
    sentences = sorted((source for source, _ in load_ptb_pairs(ptb_sample_dir, "test")), key=len)[20:24]
    return model, tokenizer, sentences


@pytest.fixture(scope="module")
def searched(untrained_parser):
    """Outputs of the compiled searches on the sentences: greedy and 3-best beam with the
    constraint, greedy without it; and each sentence's word count."""
    model, tokenizer, sentences = untrained_parser
    constraint = TreeConstraint.from_tokenizer(tokenizer)
    source_ids = Parser(model, tokenizer, "greedy").translator.source_ids(sentences)
    outputs = {
        "greedy": make_search_fn(model, "greedy", max_output_offset=12, constraint=constraint),
        "beam": make_search_fn(model, "beam", beam_size=3, num_return=3, max_output_offset=12, constraint=constraint),
        "free": make_search_fn(model, "greedy", max_output_offset=12),
    }
    outputs = {name: search(source_ids)["token_ids"].numpy() for name, search in outputs.items()}
    return outputs, constraint.source_words(source_ids).numpy(), constraint.kinds.numpy()


def test_tokenizer_keeps_tree_symbols_whole(untrained_parser):
    _, tokenizer, _ = untrained_parser
    target = "(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )"
    assert tokenizer.tokenize(target).shape[0] == len(target.split())
    constraint = TreeConstraint.from_tokenizer(tokenizer)
    kinds = constraint.kinds.numpy()
    assert [kinds[i] for i in tokenizer.tokenize(target).numpy()] == [OPEN, OPEN, TAG, TAG, CLOSING, OPEN, TAG,
                                                                      OPEN, TAG, CLOSING, CLOSING, TAG, CLOSING]


def test_untrained_model_returns_trees_over_the_input_words(untrained_parser):
    model, tokenizer, sentences = untrained_parser
    parser = Parser(model, tokenizer, "beam", batch_size=4, beam_size=3, length_penalty=0.3, max_output_offset=12)
    trees = parser(sentences)
    assert len(trees) == len(sentences)
    for sentence, line in zip(sentences, trees):
        tree = parse_tree(line)
        assert tree.label == "TOP" and tree.words() == sentence.split()


def test_without_the_constraint_untrained_outputs_are_not_trees(untrained_parser, searched):
    """The control: the same model and search, unconstrained, produce no tree (so the tests above test the mask)."""
    _, tokenizer, sentences = untrained_parser
    targets = [text.decode() for text in tokenizer.detokenize(searched[0]["free"]).numpy()]
    failures = 0
    for target, sentence in zip(targets, sentences):
        try:
            delinearize(target, sentence)
        except ValueError:
            failures += 1
    assert failures == len(sentences)


def test_beam_and_greedy_emit_only_tree_symbols_and_one_eos(searched):
    outputs, words, kinds = searched
    for rows, n in zip(np.concatenate([outputs["greedy"][:, None], outputs["beam"]], axis=1), words):
        for row in rows:
            row = row[row != PAD_ID]
            assert row[-1] == EOS_ID and (row == EOS_ID).sum() == 1
            assert (kinds[row[:-1]] == TAG).sum() == n
            assert set(kinds[row[:-1]]) <= {OPEN, CLOSING, TAG}
            depth = np.cumsum((kinds[row[:-1]] == OPEN).astype(int) - (kinds[row[:-1]] == CLOSING))
            assert depth.min() >= 0 and depth[-1] == 0


def test_parser_rejects_blank_and_overlong_lines(untrained_parser):
    model, tokenizer, _ = untrained_parser
    parser = Parser(model, tokenizer, "greedy", max_source_length=8)
    with pytest.raises(ValueError, match=r"^stdin, line 2: a blank line"):
        parser.check(["a b", "  ", "c"], name="stdin")
    with pytest.raises(ValueError, match=r"^input, line 3: \d+ pieces, longer than the model's 7$"):
        parser(["a b", "c", " ".join(["word"] * 12)])
