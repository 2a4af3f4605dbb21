"""Penn Treebank `.mrg` files: which files make each split, and their cleaned, linearized trees.

Two layouts:

* **WSJ section folders** (`DIR/00/wsj_0001.mrg` ... `DIR/24/...`, the LDC layout under
  `parsed/mrg/wsj`): the standard parsing split, sections 02-21 train, 22 val (dev), 23 test.
* **A flat directory** of `.mrg` files (the sample beside the project): split by file name.
  By default the last tenth of the files (sorted by name) is test and the tenth before it
  val; `val_files` / `test_files` (comma-separated `fnmatch` patterns such as
  `wsj_015*,wsj_0160.mrg`) choose other files. On the 169-file sample (wsj_0001-wsj_0169)
  the default is val = wsj_0136-wsj_0152, test = wsj_0153-wsj_0169; train is the rest.

Every file of a split is read and checked before any tree is returned, so a malformed file
stops the run with one line naming the file and the tree's line.
"""

import fnmatch
from pathlib import Path

from keras_transformer.data.trees import TreeError, clean, linearize, read_trees

WSJ_SECTIONS = {"train": range(2, 22), "val": (22,), "test": (23,)}
"""The standard parsing split of the WSJ sections."""

HELD_OUT_FRACTION = 0.1
"""A flat directory's default val and test parts, each this fraction of the files."""


def _patterns(value):
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    return [pattern.strip() for pattern in value if pattern.strip()]


def _matches(path, patterns):
    return any(
        fnmatch.fnmatch(path.name, pattern) or fnmatch.fnmatch(path.stem, pattern)
        for pattern in patterns
    )


def split_files(data_dir, split, val_files=None, test_files=None):
    """The `.mrg` files of `split` ("train", "val" or "test") in `data_dir`, sorted.

    Raises:
        FileNotFoundError: no such directory, or no `.mrg` file in it.
        ValueError: an unknown split, or a split that gets no file.
    """
    if split not in WSJ_SECTIONS:
        raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(WSJ_SECTIONS)}")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"No treebank directory {data_dir}")
    sections = sorted(path for path in data_dir.iterdir() if path.is_dir() and path.name.isdigit())
    if sections:
        wanted = {int(number) for number in WSJ_SECTIONS[split]}
        files = sorted(
            file
            for section in sections
            if int(section.name) in wanted
            for file in section.glob("*.mrg")
        )
        where = f"sections {', '.join(f'{number:02d}' for number in sorted(wanted))} of {data_dir}"
    else:
        every = sorted(data_dir.glob("*.mrg"))
        if not every:
            raise FileNotFoundError(f"No .mrg files in {data_dir}")
        held_out = max(1, round(len(every) * HELD_OUT_FRACTION))
        val_patterns, test_patterns = _patterns(val_files), _patterns(test_files)
        test = (
            [f for f in every if _matches(f, test_patterns)] if test_patterns else every[-held_out:]
        )
        rest = [f for f in every if f not in test]
        val = [f for f in rest if _matches(f, val_patterns)] if val_patterns else rest[-held_out:]
        files = {"train": [f for f in rest if f not in val], "val": val, "test": test}[split]
        where = f"{data_dir} (val_files={val_files!r}, test_files={test_files!r})"
    if not files:
        raise ValueError(f"No .mrg file for split {split!r} in {where}")
    return files


def read_treebank_file(path):
    """The cleaned trees of one `.mrg` file (trees that cleaning leaves empty are dropped).

    Raises:
        TreeError: `"<path>:<line>: ..."` for a malformed file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TreeError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    trees = []
    for _, tree in read_trees(text, source=str(path)):
        cleaned = clean(tree)
        if cleaned is not None:
            trees.append(cleaned)
    return trees


def read_split(data_dir, split, val_files=None, test_files=None):
    """The cleaned trees of a split, in file order."""
    return [
        tree
        for path in split_files(data_dir, split, val_files, test_files)
        for tree in read_treebank_file(path)
    ]


def load_ptb_pairs(data_dir, split, val_files=None, test_files=None):
    """`(words, linearized tree)` pairs of a split, as `data.sources.load_pairs` returns them."""
    if data_dir is None:
        raise ValueError(
            "dataset='ptb' needs data_dir: a directory of .mrg files (flat, or WSJ section folders)"
        )
    return [linearize(tree) for tree in read_split(data_dir, split, val_files, test_files)]


__all__ = ["TreeError", "split_files", "read_treebank_file", "read_split", "load_ptb_pairs"]
