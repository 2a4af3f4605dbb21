"""Pick a parallel corpus by name: the embedded task, Multi30k, WMT14 or plain files."""

from keras_transformer.data.builtin_task import builtin_task
from keras_transformer.data.corpus import load_multi30k, load_wmt14, read_parallel

DATASETS = ("builtin", "multi30k", "wmt14", "files")
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
        files: for "files": `{split: (source_path, target_path)}`.

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
    if dataset == "files":
        if not files or split not in files:
            raise ValueError(f"dataset='files' needs source/target files for split {split!r}. Received: files={files!r}")
        return read_parallel(*files[split])
    raise ValueError(f"Unknown dataset {dataset!r}. Valid datasets: {', '.join(DATASETS)}")
