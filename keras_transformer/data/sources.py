"""Pick a parallel corpus by name: the embedded task, Multi30k, WMT14, plain files or a treebank."""

from keras_transformer.data.builtin_task import builtin_task
from keras_transformer.data.corpus import load_multi30k, load_wmt14, read_parallel

DATASETS = ("builtin", "multi30k", "wmt14", "files", "ptb")
# The corpora whose language pair `src_lang`/`tgt_lang` pick (the others ignore them).
LANGUAGE_PAIR_DATASETS = ("multi30k", "wmt14")
SPLITS = ("train", "val", "test")


def load_pairs(dataset, split, src_lang="en", tgt_lang="de", data_dir=None, files=None):
    """`(source, target)` sentence pairs of one split.

    Args:
        dataset: "builtin" (English -> German number words, no download), "multi30k",
            "wmt14" (needs the `wmt` extra) or "files".
        split: "train", "val" or "test" (Multi30k's test is test_2016_flickr; WMT14's
            val/test are newstest2013/newstest2014).
        src_lang, tgt_lang: language codes (ignored by "builtin" and "files").
        data_dir: local copy of the corpus (Multi30k: the raw `.gz` files; WMT14: the
            tensorflow-datasets data directory). `None` downloads.
        files: for "files": `{split: (source_path, target_path)}`; for "ptb" (Penn Treebank
            `.mrg` files in `data_dir`, parsed as words -> linearized tree, see
            `data.treebank`): optionally `{"val": patterns, "test": patterns}`, the file
            names of a flat directory's held-out splits.

    Raises:
        ValueError: unknown dataset or split, or a missing split for "files".
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(SPLITS)}")
    if dataset == "builtin":
        return builtin_task(split)
    if dataset == "multi30k":
        return load_multi30k(src_lang, tgt_lang, split, data_dir=data_dir)
    if dataset == "wmt14":
        return load_wmt14(src_lang, tgt_lang, split, data_dir=data_dir)
    if dataset == "ptb":
        from keras_transformer.data.treebank import load_ptb_pairs

        files = files or {}
        return load_ptb_pairs(data_dir, split, files.get("val"), files.get("test"))
    if dataset == "files":
        if not files or split not in files:
            raise ValueError(
                f"dataset='files' needs source/target files for split {split!r}. Received: files={files!r}"
            )
        return read_parallel(*files[split])
    raise ValueError(f"Unknown dataset {dataset!r}. Valid datasets: {', '.join(DATASETS)}")


def whole_words(dataset, train_pairs):
    """Words the tokenizer must keep as one piece each for `dataset`: a treebank's tree
    symbols (brackets, labels, tags; `data.trees.tree_symbols`), none for text corpora."""
    if dataset == "ptb":
        from keras_transformer.data.trees import tree_symbols

        return tree_symbols(target for _, target in train_pairs)
    return []
