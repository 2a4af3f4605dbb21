"""Constituency trees: reading bracketed trees, Penn Treebank cleaning, and the linearization
that turns parsing into sequence-to-sequence translation.

A `Tree` is a label with children; a preterminal's single child is its word (a `str`).

Cleaning (`clean`) follows the parsing literature (Collins 1999; Petrov et al. 2006;
Vinyals et al. 2015): empty elements (`-NONE-` preterminals) are removed with every
constituent they leave empty, function tags and indices are stripped (`NP-SBJ-1` -> `NP`,
`PP-LOC=2` -> `PP`; labels that start with `-`, such as `-LRB-` and `-NONE-`, are labels,
not tags), and the root is `TOP`.

Linearization (`linearize`, after Vinyals et al. 2015, "Grammar as a Foreign Language"): the
source is the words; the target is the bracketing below `TOP` with words left out, each
word standing as its POS tag. An opening bracket is one symbol `(LABEL`, a closing bracket
is `)`:

    (TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .)))
    source: Ms. Haag plays Elianti .
    target: (S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )

`delinearize(target, words)` puts the words back; for every cleaned tree,
`delinearize(*reversed(linearize(tree)))` equals the tree.

The words of a sentence to parse are `sentence_words(sentence)`, the one rule that the parser,
its tree constraint and the export share (see `sentence_words`).
"""

import re

ROOT = "TOP"
OPEN_PREFIX = "("
CLOSE = ")"

# The Penn Treebank's POS tags (Santorini 1990, plus -LRB-/-RRB- and the quote tags) and its
# phrase labels (Bies et al. 1995). Linearized targets write each as one symbol; labels found
# in a treebank outside these lists are added from the data (`tree_symbols`).
PTB_TAGS = (
    "CC",
    "CD",
    "DT",
    "EX",
    "FW",
    "IN",
    "JJ",
    "JJR",
    "JJS",
    "LS",
    "MD",
    "NN",
    "NNS",
    "NNP",
    "NNPS",
    "PDT",
    "POS",
    "PRP",
    "PRP$",
    "RB",
    "RBR",
    "RBS",
    "RP",
    "SYM",
    "TO",
    "UH",
    "VB",
    "VBD",
    "VBG",
    "VBN",
    "VBP",
    "VBZ",
    "WDT",
    "WP",
    "WP$",
    "WRB",
    "#",
    "$",
    "''",
    "``",
    ",",
    ".",
    ":",
    "-LRB-",
    "-RRB-",
)
PTB_LABELS = (
    "ADJP",
    "ADVP",
    "CONJP",
    "FRAG",
    "INTJ",
    "LST",
    "NAC",
    "NP",
    "NX",
    "PP",
    "PRN",
    "PRT",
    "QP",
    "RRC",
    "S",
    "SBAR",
    "SBARQ",
    "SINV",
    "SQ",
    "UCP",
    "VP",
    "WHADJP",
    "WHADVP",
    "WHNP",
    "WHPP",
    "X",
)
EMPTY_TAG = "-NONE-"
BRACKET_WORDS = {"(": "-LRB-", ")": "-RRB-"}
"""How the treebank writes a bracket that is a word (or part of one): a tree line can hold no
bare bracket outside its structure."""

_TOKEN = re.compile(r"\(|\)|[^\s()]+")


class TreeError(ValueError):
    """A bracketed tree that cannot be read; the message names the file and line."""


class Tree:
    """A constituent: `label` and `children` (`Tree`s, or one word `str` for a preterminal)."""

    __slots__ = ("label", "children")

    def __init__(self, label, children):
        self.label = label
        self.children = list(children)

    @property
    def is_preterminal(self):
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def words(self):
        """The words, left to right."""
        return [word for _, word in self.tagged_words()]

    def tagged_words(self):
        """`(tag, word)` pairs, left to right."""
        if self.is_preterminal:
            return [(self.label, self.children[0])]
        return [pair for child in self.children for pair in child.tagged_words()]

    def __eq__(self, other):
        return (
            isinstance(other, Tree)
            and self.label == other.label
            and self.children == other.children
        )

    def __repr__(self):
        return f"Tree({self})"

    def __str__(self):
        """One line, as EVALB and most tools read it: `(TOP (S (NP (NNP Ms.) ...)))`."""
        if self.is_preterminal:
            return f"({self.label} {self.children[0]})"
        return f"({self.label} {' '.join(str(child) for child in self.children)})"


def read_trees(text, source="<string>"):
    """Every tree of a bracketed text, in order: `[(line, Tree)]`.

    Trees may span lines (the treebank's `.mrg` layout) or sit one a line; an unlabeled outer
    bracket (`( (S ...) )`) gets the label `""`. `line` is the 1-based line where the tree
    starts.

    Raises:
        TreeError: `"<source>:<line>: <what is wrong>"` for an unbalanced bracket, an empty
            bracket, a word outside a tree or a preterminal with more than one word.
    """
    trees = []
    stack = []  # [(label, children, line)]
    for line_number, line in enumerate(text.splitlines(), start=1):
        tokens = _TOKEN.findall(line)
        position = 0
        while position < len(tokens):
            token = tokens[position]
            if token == "(":
                label = ""
                if position + 1 < len(tokens) and tokens[position + 1] not in "()":
                    label = tokens[position + 1]
                    position += 1
                stack.append((label, [], line_number))
            elif token == ")":
                if not stack:
                    raise TreeError(
                        f"{source}:{line_number}: a closing bracket without an opening one"
                    )
                label, children, start = stack.pop()
                if not children:
                    raise TreeError(f"{source}:{start}: an empty bracket ({label or 'unlabeled'})")
                words = [child for child in children if isinstance(child, str)]
                if words and len(children) > 1:
                    raise TreeError(
                        f"{source}:{start}: ({label} ...) mixes words and brackets or holds more than one word"
                    )
                tree = Tree(label, children)
                if stack:
                    stack[-1][1].append(tree)
                else:
                    trees.append((start, tree))
            else:
                if not stack:
                    raise TreeError(f"{source}:{line_number}: {token!r} outside a tree")
                stack[-1][1].append(token)
            position += 1
    if stack:
        raise TreeError(f"{source}:{stack[0][2]}: the tree starting here is not closed")
    return trees


def strip_function_tags(label):
    """`NP-SBJ-1` -> `NP`, `PP-LOC=2` -> `PP`, `-NONE-` and `-LRB-` unchanged."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def clean(tree):
    """A treebank tree as parsers see it: a `TOP` root, no empty elements or the constituents
    they leave empty, no function tags or indices. Returns None when nothing is left.
    """
    root = tree if tree.label in ("", ROOT) else Tree("", [tree])
    children = [kept for kept in (_clean(child) for child in root.children) if kept is not None]
    return Tree(ROOT, children) if children else None


def _clean(tree):
    if tree.is_preterminal:
        return None if tree.label == EMPTY_TAG else Tree(tree.label, tree.children)
    children = [kept for kept in (_clean(child) for child in tree.children) if kept is not None]
    return Tree(strip_function_tags(tree.label), children) if children else None


def parse_tree(line):
    """One tree from its one-line bracketed form (`str(tree)`); `TreeError` unless exactly one."""
    trees = read_trees(line)
    if len(trees) != 1:
        raise TreeError(f"<string>:1: expected one tree, found {len(trees)}")
    return trees[0][1]


def linearize(tree):
    """`(source, target)` strings of a cleaned tree: its words, and its brackets and tags.

    Example:

    >>> linearize(parse_tree("(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays)) (. .)))"))
    ('Ms. Haag plays .', '(S (NP NNP NNP ) (VP VBZ ) . )')
    """
    symbols = []
    for child in tree.children:
        _linearize(child, symbols)
    return " ".join(tree.words()), " ".join(symbols)


def _linearize(tree, symbols):
    if tree.is_preterminal:
        symbols.append(tree.label)
        return
    symbols.append(OPEN_PREFIX + tree.label)
    for child in tree.children:
        _linearize(child, symbols)
    symbols.append(CLOSE)


def tree_word(word):
    """`word` as a tree writes it: each `(` as `-LRB-`, each `)` as `-RRB-` (`BRACKET_WORDS`)."""
    for bracket, name in BRACKET_WORDS.items():
        word = word.replace(bracket, name)
    return word


def sentence_words(sentence):
    """The words of a tokenized sentence, as every parsing path counts them.

    The sentence is split at whitespace as `str.split()` splits it (runs of any character
    that `str.isspace()` calls whitespace: space, tab, NBSP, U+0085, U+3000, ...; no empty
    word), and each word is written as a tree writes it (`tree_word`: `(` -> `-LRB-`, `)` ->
    `-RRB-`, the treebank's own words for them). `Parser` feeds the model these words joined
    by single spaces and puts them back into its trees; the exported parser splits in the
    graph with the same rule (`export.parser.sentence_words_in_graph`). Whether the model's
    tokenizer keeps each of them as one word is `TreeConstraint.kept_words`.

    Example:

    >>> sentence_words("He said\t( yes ) .")
    ['He', 'said', '-LRB-', 'yes', '-RRB-', '.']
    """
    return [tree_word(word) for word in sentence.split()]


def delinearize(target, words):
    """The tree of a linearized `target` with `words` put back.

    `words` is a sentence (split by `sentence_words`) or a list of words (each written by
    `tree_word`), so the tree's one-line form reads back as the same tree.

    Raises:
        TreeError: when `target` is not a well-formed bracketing with one tag per word.
    """
    symbols = target.split() if isinstance(target, str) else list(target)
    words = sentence_words(words) if isinstance(words, str) else [tree_word(word) for word in words]
    stack = [Tree(ROOT, [])]
    position = 0
    for symbol in symbols:
        if symbol == CLOSE:
            if len(stack) == 1 or not stack[-1].children:
                raise TreeError(f"<target>: an unmatched or empty bracket in {' '.join(symbols)!r}")
            done = stack.pop()
            stack[-1].children.append(done)
        elif symbol.startswith(OPEN_PREFIX) and len(symbol) > 1:
            stack.append(Tree(symbol[1:], []))
        else:
            if position >= len(words):
                raise TreeError(
                    f"<target>: more tags than the {len(words)} words in {' '.join(symbols)!r}"
                )
            stack[-1].children.append(Tree(symbol, [words[position]]))
            position += 1
    if len(stack) != 1 or position != len(words) or not stack[0].children:
        raise TreeError(
            f"<target>: {' '.join(symbols)!r} is not a complete tree over {len(words)} words"
        )
    return stack[0]


def right_branching(words, tags, label="S"):
    """The right-branching tree over `words` with `tags`: `(TOP (S t1 (S t2 (S ... tn))))`.

    The baseline of the parsing results: every constituent opens at a word and closes at the
    sentence's end.
    """
    preterminals = [Tree(tag, [word]) for tag, word in zip(tags, words)]
    tree = Tree(label, preterminals[-1:])
    for preterminal in reversed(preterminals[:-1]):
        tree = Tree(label, [preterminal, tree])
    return Tree(ROOT, [tree])


def tree_symbols(targets=()):
    """The target symbols of linearized trees: `(LABEL` for every phrase label, `)`, every POS tag.

    The Penn Treebank's own labels and tags always, those of `targets` (linearized strings)
    added, sorted, so that a label missing from the training data still reads as one symbol.
    """
    tags = set(PTB_TAGS)
    opens = {OPEN_PREFIX + label for label in PTB_LABELS}
    for target in targets:
        for symbol in target.split():
            if symbol.startswith(OPEN_PREFIX) and len(symbol) > 1:
                opens.add(symbol)
            elif symbol != CLOSE:
                tags.add(symbol)
    return [CLOSE, *sorted(opens), *sorted(tags)]
