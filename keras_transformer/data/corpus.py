"""Reading parallel text corpora: plain or gzip files, Multi30k and WMT'14.

Every loader returns a `list[tuple[str, str]]` of `(source, target)`
sentence pairs, the format that `keras_transformer.data.make_dataset`
and `keras_transformer.data.train_sentencepiece` consume.
"""

import gzip
import os
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from keras_transformer import fs
from keras_transformer.layers.checks import check_positive_int

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
"""Base URL of the raw Multi30k task 1 files (`{split}.{lang}.gz`)."""

MULTI30K_LANGUAGES = ("en", "de", "fr", "cs")
"""Languages that `load_multi30k` accepts."""

MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
"""Canonical Multi30k split names, as used in the file names."""

_MULTI30K_SPLIT_ALIASES = {
    "train": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test_2016_flickr",
    "test_2016_flickr": "test_2016_flickr",
}

WMT14_PAIRS = (("de", "en"), ("fr", "en"))
"""Language pairs of the `wmt14_translate` TFDS configs, as `(xx, "en")`."""

_WMT14_SPLIT_ALIASES = {
    "train": "train",
    "val": "validation",
    "valid": "validation",
    "validation": "validation",
    "test": "test",
}

_DOWNLOAD_TIMEOUT_S = 60.0


def read_lines(path):
    """Read a UTF-8 text file, plain or gzip-compressed, into a list of lines.

    A file whose name ends in `.gz` is decompressed. The bytes are decoded as
    strict UTF-8. Only the line terminator is removed from each line (`\\n`
    and a `\\r` before it); other whitespace is kept. A final line without a
    terminator is kept; the empty string after a final terminator is not a line.

    Args:
        path: file to read.

    Returns:
        the lines of the file, in order.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: if the file is empty, is not valid gzip data although
            named `.gz`, or is not valid UTF-8 (the message names the file and
            the 1-based line number of the first invalid byte).

    Example:
        >>> lines = read_lines("../shared/data/multi30k/val.en.gz")
        >>> lines[0]
        'A group of men are loading cotton onto a truck'
    """
    if not fs.isfile(path):
        raise FileNotFoundError(f"No such file: {path}")
    data = fs.read_bytes(path)
    if str(path).endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"Corrupt gzip file {path}: {err}") from err
    if not data:
        raise ValueError(f"Empty file: {path} contains no lines")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as err:
        line_number = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"Invalid UTF-8 in {path} line {line_number}: "
            f"byte {data[err.start : err.start + 1]!r} ({err.reason})"
        ) from err
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel(source_path, target_path):
    """Read two line-aligned files into `(source, target)` pairs.

    Args:
        source_path: file with one source sentence a line (plain or `.gz`).
        target_path: file with the translation of line `i` of
            `source_path` on its line `i`.

    Returns:
        one `(source, target)` tuple per line.

    Raises:
        FileNotFoundError: if either file does not exist.
        ValueError: if either file cannot be read (see `read_lines`) or
            the two files have different numbers of lines; the message names
            both files, both counts and the first line without a partner.

    Example:
        >>> pairs = read_parallel("../shared/data/multi30k/val.en.gz",
        ...                       "../shared/data/multi30k/val.de.gz")
        >>> pairs[0]
        ('A group of men are loading cotton onto a truck',
         'Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen')
    """
    source = read_lines(source_path)
    target = read_lines(target_path)
    if len(source) != len(target):
        shorter, longer = (
            (source_path, target_path) if len(source) < len(target) else (target_path, source_path)
        )
        first_unpaired = min(len(source), len(target)) + 1
        raise ValueError(
            f"Line count mismatch: {source_path} has {len(source)} lines but "
            f"{target_path} has {len(target)} lines; {shorter} ends before line "
            f"{first_unpaired}, so line {first_unpaired} of {longer} has no partner"
        )
    return list(zip(source, target))


def _check_language(lang, valid, what):
    if lang not in valid:
        raise ValueError(f"Unknown {what} {lang!r}; valid languages: {', '.join(valid)}")


def _multi30k_split(split):
    try:
        return _MULTI30K_SPLIT_ALIASES[split]
    except KeyError:
        raise ValueError(
            f"Unknown Multi30k split {split!r}; valid splits: {', '.join(MULTI30K_SPLITS)} "
            f"(aliases: validation, valid -> val; test -> test_2016_flickr)"
        ) from None


def _local_multi30k_file(data_dir, split, lang):
    compressed = fs.join(data_dir, f"{split}.{lang}.gz")
    plain = fs.join(data_dir, f"{split}.{lang}")
    if fs.isfile(compressed):
        return compressed
    if fs.isfile(plain):
        return plain
    raise FileNotFoundError(
        f"No Multi30k file for split {split!r}, language {lang!r}: "
        f"neither {compressed} nor {plain} exists"
    )


def _download(url, destination):
    """Download `url` to `destination` (a small file: read whole, written atomically)."""
    try:
        fs.makedirs(fs.parent(destination))
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
        fs.write_bytes(destination, data)
    except (urllib.error.URLError, OSError) as err:
        raise OSError(
            f"Could not download {url} to {destination}: {err}. Without network access, "
            f"pass data_dir= pointing to a directory that holds the Multi30k files"
        ) from err


def load_multi30k(
    src_lang,
    tgt_lang,
    split,
    data_dir=None,
    cache_dir=None,
    base_url=MULTI30K_URL,
):
    """Load one split of the Multi30k (task 1) parallel corpus.

    With `data_dir`, reads `{data_dir}/{split}.{lang}.gz` (or the
    uncompressed `{data_dir}/{split}.{lang}` when no `.gz` file exists).
    Without it, downloads `{base_url}/{split}.{lang}.gz` into `cache_dir`
    unless already there, and reads the cached copy. Downloads go to a
    temporary file that is renamed into place, so an interrupted download never
    leaves a partial file behind.

    Args:
        src_lang: source language, one of `en`, `de`, `fr`, `cs`.
        tgt_lang: target language, from the same set, different from
            `src_lang`.
        split: `train`, `val` or `test_2016_flickr`; `validation` and
            `valid` mean `val`, `test` means `test_2016_flickr`.
        data_dir: directory with local copies of the files. Nothing is
            downloaded when given.
        cache_dir: where downloads are kept. Defaults to
            `~/.cache/keras_transformer/multi30k`.
        base_url: where the files are downloaded from; any URL that
            `urllib` opens, `file://` included.

    Returns:
        `(source, target)` sentence pairs, in corpus order.

    Raises:
        ValueError: on an unknown language or split, equal languages, or a file
            that cannot be read (see `read_parallel`).
        FileNotFoundError: if `data_dir` lacks a needed file.
        OSError: if a download fails.

    Example:
        >>> pairs = load_multi30k("en", "de", "val",
        ...                       data_dir="../shared/data/multi30k")
        >>> len(pairs)
        1014
    """
    _check_language(src_lang, MULTI30K_LANGUAGES, "Multi30k source language")
    _check_language(tgt_lang, MULTI30K_LANGUAGES, "Multi30k target language")
    if src_lang == tgt_lang:
        raise ValueError(f"Source and target language are both {src_lang!r}; they must differ")
    split = _multi30k_split(split)
    if data_dir is not None:
        paths = [_local_multi30k_file(data_dir, split, lang) for lang in (src_lang, tgt_lang)]
    else:
        cache = (
            cache_dir
            if cache_dir is not None
            else Path.home() / ".cache" / "keras_transformer" / "multi30k"
        )
        paths = []
        for lang in (src_lang, tgt_lang):
            name = f"{split}.{lang}.gz"
            path = fs.join(cache, name)
            if not fs.isfile(path):
                _download(f"{base_url.rstrip('/')}/{name}", path)
            paths.append(path)
    return read_parallel(paths[0], paths[1])


def _wmt14_split(split):
    try:
        return _WMT14_SPLIT_ALIASES[split]
    except KeyError:
        raise ValueError(
            f"Unknown WMT'14 split {split!r}; valid splits: train, validation, test "
            f"(aliases: val, valid -> validation)"
        ) from None


def load_wmt14(src_lang, tgt_lang, split, data_dir=None, max_examples=None):
    """Load one split of WMT'14 English-German or English-French via TFDS.

    Uses the `wmt14_translate/de-en` or `wmt14_translate/fr-en`
    configuration of `tensorflow_datasets`, which downloads and prepares the
    data on first use (several GB for the training split).

    Args:
        src_lang: source language: `en`, `de` or `fr`.
        tgt_lang: target language; one of the two languages must be `en` and
            the other `de` or `fr`.
        split: `train`, `validation` (newstest2013) or `test`
            (newstest2014); `val` and `valid` mean `validation`.
        data_dir: TFDS data directory; TFDS's default when `None`.
        max_examples: read at most this many pairs (the first ones).

    Returns:
        `(source, target)` sentence pairs.

    Raises:
        ImportError: if `tensorflow_datasets` is not installed.
        ValueError: on an unsupported language pair, unknown split or a
            non-positive `max_examples`.

    Example:
        `load_wmt14("en", "de", "test", max_examples=100)` downloads
        newstest2014 on first use. Offline, TFDS's mock data (random text with
        the real features) stands in for the download:

        >>> import tensorflow_datasets as tfds
        >>> with tfds.testing.mock_data(num_examples=3):
        ...     pairs = load_wmt14("en", "de", "test", max_examples=2)
        >>> len(pairs), [type(text).__name__ for text in pairs[0]]
        (2, ['str', 'str'])
    """
    pair = tuple(sorted((src_lang, tgt_lang), key=lambda lang: lang == "en"))
    if pair not in WMT14_PAIRS:
        raise ValueError(
            f"Unsupported WMT'14 language pair {src_lang!r} -> {tgt_lang!r}; valid pairs: "
            f"en<->de, en<->fr"
        )
    split = _wmt14_split(split)
    if max_examples is not None:
        check_positive_int("max_examples", max_examples)
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise ImportError(
            "load_wmt14 needs tensorflow-datasets; install it with "
            "`pip install keras-transformer-toolkit[wmt]`"
        ) from err
    dataset = tfds.load(
        f"wmt14_translate/{pair[0]}-{pair[1]}",
        split=split,
        data_dir=None if data_dir is None else os.fspath(data_dir),
        shuffle_files=False,
    )
    if max_examples is not None:
        dataset = dataset.take(max_examples)
    return [
        (example[src_lang].decode("utf-8"), example[tgt_lang].decode("utf-8"))
        for example in tfds.as_numpy(dataset)
    ]
