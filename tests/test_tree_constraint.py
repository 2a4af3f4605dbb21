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
from keras_transformer.models.transformer import Transformer, build_model

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
    train_sentencepiece(
        [text for pair in pairs for text in pair],
        path,
        600,
        whole_words=tree_symbols(target for _, target in pairs),
    )
    tokenizer = Tokenizer(path)
    model = Transformer(
        get_preset(
            "tiny",
            vocabulary_size=600,
            num_encoder_layers=1,
            num_decoder_layers=1,
            hidden_dim=32,
            intermediate_dim=64,
            num_heads=2,
        )
    )
    sentences = sorted((source for source, _ in load_ptb_pairs(ptb_sample_dir, "test")), key=len)[
        20:24
    ]
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
        "beam": make_search_fn(
            model, "beam", beam_size=3, num_return=3, max_output_offset=12, constraint=constraint
        ),
        "free": make_search_fn(model, "greedy", max_output_offset=12),
    }
    outputs = {name: search(source_ids)["token_ids"].numpy() for name, search in outputs.items()}
    return outputs, constraint.source_words(source_ids).numpy(), constraint.kinds


def test_tokenizer_keeps_tree_symbols_whole(untrained_parser):
    _, tokenizer, _ = untrained_parser
    target = "(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )"
    assert tokenizer.tokenize(target).shape[0] == len(target.split())
    constraint = TreeConstraint.from_tokenizer(tokenizer)
    kinds = constraint.kinds
    assert [kinds[i] for i in tokenizer.tokenize(target).numpy()] == [
        OPEN,
        OPEN,
        TAG,
        TAG,
        CLOSING,
        OPEN,
        TAG,
        OPEN,
        TAG,
        CLOSING,
        CLOSING,
        TAG,
        CLOSING,
    ]


def test_untrained_model_returns_trees_over_the_input_words(untrained_parser):
    model, tokenizer, sentences = untrained_parser
    parser = Parser(
        model,
        tokenizer,
        "beam",
        batch_size=4,
        beam_size=3,
        length_penalty=0.3,
        max_output_offset=12,
    )
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
    for rows, n in zip(
        np.concatenate([outputs["greedy"][:, None], outputs["beam"]], axis=1), words
    ):
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


# --- word positions (`config.word_positions`): the model's positions count words and tags ---


@pytest.fixture(scope="module", params=[None, 1], ids=["all_words", "word_window_1"])
def word_position_model(request, untrained_parser):
    """An untrained `word_positions` model with the table of the tree tokenizer, without and
    with a word window on encoder-decoder attention."""
    from keras_transformer.models.parsing import word_kinds

    _, tokenizer, _ = untrained_parser
    model = build_model(
        get_preset(
            "tiny",
            vocabulary_size=600,
            num_encoder_layers=1,
            num_decoder_layers=2,
            hidden_dim=32,
            intermediate_dim=64,
            num_heads=2,
            word_positions=True,
            word_window=request.param,
        )
    )
    model.set_word_kinds(word_kinds(tokenizer))
    return model


def _source_words(model, source_ids):
    """`decode`'s and `decode_step`'s `source_word_positions` argument for `model`."""
    return (
        {"source_word_positions": model.source_word_positions(source_ids)}
        if model.uses_word_window
        else {}
    )


def test_word_kinds_of_the_tree_tokenizer(untrained_parser):
    from keras_transformer.layers.positional import WordIndex
    from keras_transformer.models.parsing import word_kinds

    _, tokenizer, _ = untrained_parser
    kinds = word_kinds(tokenizer)
    assert kinds.shape == (600,)
    piece_kinds = {tokenizer.id_to_piece(i): kinds[i] for i in range(600)}
    assert {piece_kinds[p] for p in ("▁NN", "▁DT", "▁,", "▁-LRB-")} == {WordIndex.TAG}
    assert {piece_kinds[p] for p in ("▁(S", "▁(NP", "▁)", "▁the", "</s>")} == {WordIndex.WORD_START}
    assert {piece_kinds[p] for p in ("<pad>", "<s>", "<unk>")} == {WordIndex.OTHER}
    inside = [p for p in piece_kinds if not p.startswith("▁") and not p.startswith("<")]
    assert inside and {piece_kinds[p] for p in inside} == {WordIndex.OTHER}


def test_word_position_model_decodes_step_by_step_as_the_full_model(
    untrained_parser, word_position_model
):
    """`decode_step` with `target_word_positions` of the prefix gives the teacher-forced logits,
    and the cached greedy search (which computes those positions) equals the uncached one."""
    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.decoding.greedy import greedy_search

    model = word_position_model
    _, tokenizer, sentences = untrained_parser
    source_ids = Parser(model, tokenizer, "greedy").translator.source_ids(sentences[:2])
    targets = tokenizer.tokenize(
        ["(S (NP DT NN ) (VP VBZ ) . )", "(S NNP (VP VBD (NP NN ) ) )"]
    ).to_tensor()
    target_ids = np.concatenate([np.full((2, 1), BOS_ID), targets.numpy()], axis=1)
    encoder_outputs, source_mask = model.encode(source_ids)
    source_words = _source_words(model, source_ids)
    full = model.decode(target_ids, encoder_outputs, source_mask, **source_words).numpy()
    inputs = {"source_ids": source_ids.numpy(), "target_ids": target_ids}
    real = target_ids != PAD_ID  # the model skips the padding (its logits there are not computed)
    np.testing.assert_allclose(model(inputs).numpy()[real], full[real], rtol=0, atol=1e-5)
    words = model.target_word_positions(target_ids)
    assert words.numpy().tolist()[0] == [
        0,
        0,
        0,
        1,
        2,
        2,
        2,
        3,
        3,
        4,
        4,
    ]  # BOS (S (NP DT NN ) (VP VBZ ) . )
    cache = model.init_cache(encoder_outputs, target_ids.shape[1])
    steps = []
    for index in range(target_ids.shape[1]):
        logits, cache = model.decode_step(
            target_ids[:, index : index + 1],
            cache,
            index,
            source_mask,
            word_positions=words[:, index : index + 1],
            **source_words,
        )
        steps.append(logits.numpy()[:, 0])
    np.testing.assert_allclose(np.stack(steps, axis=1)[real], full[real], rtol=0, atol=1e-4)
    constraint = TreeConstraint.from_tokenizer(tokenizer)
    cached, _ = greedy_search(model, source_ids, max_output_offset=12, constraint=constraint)
    uncached, _ = greedy_search(
        model, source_ids, max_output_offset=12, constraint=constraint, use_cache=False
    )
    np.testing.assert_array_equal(cached.numpy(), uncached.numpy())
    all_ids = Parser(model, tokenizer, "greedy").translator.source_ids(
        sentences
    )  # finished sentences leave the beam
    beams = [
        beam_search(
            model,
            all_ids,
            beam_size=2,
            num_return=2,
            max_output_offset=12,
            constraint=constraint,
            use_cache=use_cache,
        )[0].numpy()
        for use_cache in (True, False)
    ]
    np.testing.assert_array_equal(beams[0], beams[1])
    with pytest.raises(ValueError, match="decode_step takes word_positions exactly when"):
        model.decode_step(
            target_ids[:, :1], model.init_cache(encoder_outputs, 4), 0, source_mask, **source_words
        )
    if model.uses_word_window:
        with pytest.raises(ValueError, match="decode takes source_word_positions exactly when"):
            model.decode(target_ids, encoder_outputs, source_mask)


def test_word_window_limits_encoder_decoder_attention(untrained_parser, word_position_model):
    """With `word_window=r` a query attends only to the pieces of the words at most r from its
    word; without one, to every piece."""
    model = word_position_model
    _, tokenizer, sentences = untrained_parser
    source_ids = Parser(model, tokenizer, "greedy").translator.source_ids(sentences[:2])
    target_ids = np.concatenate(
        [np.full((2, 1), BOS_ID), tokenizer.tokenize(["(S NN NN (VP NN"] * 2).numpy()], axis=1
    )
    encoder_outputs, source_mask = model.encode(source_ids)
    _, scores = model.decode(
        target_ids,
        encoder_outputs,
        source_mask,
        return_attention_scores=True,
        **_source_words(model, source_ids),
    )
    source_words = model.source_word_positions(source_ids).numpy()  # (B, S)
    query_words = model.target_word_positions(target_ids).numpy()  # (B, T): 0 0 1 2 2 3
    distance = np.abs(source_words[:, None, :] - query_words[:, :, None])  # (B, T, S)
    for layer in scores:
        cross = layer["cross"].numpy()  # (B, H, T, S)
        far = cross * (distance > 1)[:, None]
        if model.uses_word_window:
            assert far.max() == 0.0
        else:
            assert far.max() > 0.01


def test_word_positions_come_from_the_table(untrained_parser, word_position_model):
    """The control: the same weights with another table (no word starts, no tags) give other logits."""
    model = word_position_model
    _, tokenizer, sentences = untrained_parser
    source_ids = Parser(model, tokenizer, "greedy").translator.source_ids(sentences[:2]).numpy()
    target_ids = np.concatenate(
        [np.full((2, 1), BOS_ID), tokenizer.tokenize(["NN NN NN"] * 2).numpy()], axis=1
    )
    inputs = {"source_ids": source_ids, "target_ids": target_ids}
    logits = model(inputs).numpy()
    other = build_model(model.config)
    other.set_weights([np.zeros_like(w) if w.dtype == np.int32 else w for w in model.get_weights()])
    assert np.abs(other(inputs).numpy() - logits).max() > 1e-3


def test_word_position_parser_returns_trees(untrained_parser, word_position_model):
    _, tokenizer, sentences = untrained_parser
    for method, options in (("greedy", {}), ("beam", dict(beam_size=3, length_penalty=0.3))):
        parser = Parser(
            word_position_model, tokenizer, method, batch_size=4, max_output_offset=12, **options
        )
        for sentence, line in zip(sentences, parser(sentences)):
            assert parse_tree(line).words() == sentence.split()


# --- one word rule: `data.trees.sentence_words`, kept word for word by the tokenizer ---


def test_kept_words_are_those_the_tokenizer_keeps_as_one_word(untrained_parser):
    """A word is kept when its pieces hold exactly one word-starting piece, the first: not when
    the normaliser deletes it (U+200B, U+FFFD) or splits it (a `▁` or a U+200B inside)."""
    _, tokenizer, _ = untrained_parser
    words = [
        "the",
        "\u200b",
        "\ufffd",
        "a\u2581b",
        "a\u200bb",
        "-LRB-",
        "NN",
        "caf\ufffd",
        "\u2603",
        "ａｂ",
    ]
    kept, starts = TreeConstraint.from_tokenizer(tokenizer).kept_words(tokenizer, words)
    assert dict(zip(words, zip(kept.numpy().tolist(), starts.numpy().tolist()))) == {
        "the": (True, 1),
        "\u200b": (False, 0),
        "\ufffd": (False, 0),
        "a\u2581b": (False, 2),
        "a\u200bb": (False, 2),
        "-LRB-": (True, 1),
        "NN": (True, 1),
        "caf\ufffd": (True, 1),
        "\u2603": (True, 1),
        "ａｂ": (True, 1),
    }


# Lines the parser takes: whitespace of every kind, brackets as words, a word with U+FFFD inside,
# an unknown character, a word that spells a tag.
KEPT_LINES = ["a\tb", "x\u00a0y z", "a \x85 b\u3000c", "He said ( yes ) .", "caf\ufffd \u2603 NN"]


def test_one_word_count_on_every_path(untrained_parser):
    """For each line the parser takes, the words of `sentence_words` are the words the constraint
    counts, those `WordIndex` numbers (EOS is word n), and those of the parser's tree."""
    from keras_transformer.data.trees import sentence_words
    from keras_transformer.layers.positional import WordIndex
    from keras_transformer.models.parsing import word_kinds

    model, tokenizer, _ = untrained_parser
    parser = Parser(model, tokenizer, "greedy", max_output_offset=12)
    words = [sentence_words(line) for line in KEPT_LINES]
    source_ids = parser.translator.source_ids([" ".join(line) for line in words])
    counts = [len(line) for line in words]
    assert parser.constraint.source_words(source_ids).numpy().tolist() == counts
    index = WordIndex(tokenizer.vocabulary_size)
    index.set_kinds(word_kinds(tokenizer))
    positions = np.asarray(index.source(source_ids))
    assert [int(row[ids == EOS_ID][0]) for row, ids in zip(positions, source_ids.numpy())] == counts
    trees = parser(KEPT_LINES)
    assert [parse_tree(tree).words() for tree in trees] == words


def test_the_parser_and_the_export_give_the_model_the_same_text(untrained_parser):
    """Both read a line's words (`sentence_words`) joined by single spaces; the export reads ""
    for a line with a word the tokenizer does not keep (`Parser` rejects it)."""
    import tensorflow as tf

    from keras_transformer.export.parser import ParsingModule

    model, tokenizer, _ = untrained_parser
    sources = Parser(model, tokenizer, "greedy").sources(KEPT_LINES)
    assert sources == ["a b", "x y z", "a b c", "He said -LRB- yes -RRB- .", "caf\ufffd \u2603 NN"]
    module = ParsingModule(model, tokenizer, beam_size=2)
    read = module.sentences(
        tf.constant([*KEPT_LINES, "a \u200b b", "a\u2581b c", "x \ufffd"])
    ).numpy()
    assert [text.decode() for text in read] == [*sources, "", "", ""]


@pytest.mark.parametrize(
    "line, message",
    [
        ("a \u200b b", "word 2, '\\u200b': the tokenizer's normalisation deletes it"),
        ("a \ufffd b", "word 2, '\ufffd': the tokenizer's normalisation deletes it"),
        ("x a\u2581b c", "word 2, 'a\u2581b': the tokenizer's normalisation makes 2 words of it"),
        ("a\u200bb", "word 1, 'a\\u200bb': the tokenizer's normalisation makes 2 words of it"),
    ],
)
def test_parser_rejects_a_word_the_tokenizer_does_not_keep_before_parsing(
    untrained_parser, line, message
):
    model, tokenizer, _ = untrained_parser
    parser = Parser(model, tokenizer, "greedy", max_output_offset=12)
    calls = []
    with pytest.raises(ValueError) as error:
        parser(["a b", "c", line], progress=lambda done, total: calls.append(done))
    assert str(error.value).splitlines() == [
        f"input, line 3: {message} (the tree must hold the line's words one for one)"
    ]
    assert calls == []  # nothing was parsed


def test_parser_refuses_an_output_limit_below_words_plus_one(untrained_parser):
    """A tree over n words needs n tags and EOS: `max_length` 4 parses 3 words, refuses 4."""
    model, tokenizer, _ = untrained_parser
    parser = Parser(model, tokenizer, "greedy", max_length=4)
    with pytest.raises(
        ValueError,
        match=r"^input, line 2: 4 words, a tree of 5 tokens at least, "
        r"longer than max_length=4$",
    ):
        parser(["a b c", "a b c d"])
    assert parse_tree(parser(["a b c"])[0]).words() == ["a", "b", "c"]


def test_exported_parser_refuses_an_output_buffer_below_its_longest_sentence(untrained_parser):
    from keras_transformer.export.parser import ParsingModule

    model, tokenizer, _ = untrained_parser
    with pytest.raises(
        ValueError,
        match=r"^max_output_length=19 cannot hold the tree of a sentence of "
        r"max_source_length - 1 = 19 words .*use at least 20$",
    ):
        ParsingModule(model, tokenizer, beam_size=2, max_source_length=20, max_output_length=19)
    assert (
        ParsingModule(
            model, tokenizer, beam_size=2, max_source_length=20, max_output_length=20
        ).max_output_length
        == 20
    )
