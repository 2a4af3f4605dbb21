"""Tests for keras_transformer.data.corpus: file reading and the Multi30k loader."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from keras_transformer.data.corpus import (
    MULTI30K_URL,
    load_multi30k,
    read_lines,
    read_parallel,
)


def _write_gz(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb") as f:
        f.write(data)
    return path


def test_read_lines_plain_and_gzip_agree(tmp_path):
    data = b"first line\nsecond\tline  \n\nfourth\n"
    plain = tmp_path / "a.txt"
    plain.write_bytes(data)
    compressed = _write_gz(tmp_path / "a.txt.gz", data)
    expected = ["first line", "second\tline  ", "", "fourth"]
    assert read_lines(plain) == expected
    assert read_lines(compressed) == expected
    assert read_lines(str(plain)) == expected


def test_read_lines_strips_only_line_terminators(tmp_path):
    path = tmp_path / "crlf.txt"
    # \u2028 (line separator) and \x0c (form feed) are not line breaks here.
    path.write_bytes("  lead\r\nmid\u2028dle\x0c\r\nlast without newline ".encode("utf-8"))
    assert read_lines(path) == ["  lead", "mid\u2028dle\x0c", "last without newline "]


def test_read_lines_keeps_non_ascii(tmp_path):
    path = tmp_path / "de.txt"
    path.write_text("Größe\nMädchen läuft\n", encoding="utf-8")
    assert read_lines(path) == ["Größe", "Mädchen läuft"]


def test_read_lines_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope.de.gz"
    with pytest.raises(FileNotFoundError, match="nope.de.gz"):
        read_lines(missing)


@pytest.mark.parametrize("name", ["empty.txt", "empty.txt.gz"])
def test_read_lines_empty_file_names_file(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".gz"):
        _write_gz(path, b"")
    else:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"Empty file: .*{name}"):
        read_lines(path)


@pytest.mark.parametrize("name", ["train.de", "train.de.gz"])
def test_read_lines_invalid_utf8_names_file_and_line(tmp_path, name):
    data = b"ok\nstill ok\nbad \xff byte\nok again\n"
    path = tmp_path / name
    if name.endswith(".gz"):
        _write_gz(path, data)
    else:
        path.write_bytes(data)
    with pytest.raises(ValueError, match=f"Invalid UTF-8 in .*{name} line 3"):
        read_lines(path)


def test_read_lines_corrupt_gzip(tmp_path):
    path = tmp_path / "broken.en.gz"
    path.write_bytes(b"this is not gzip data\n")
    with pytest.raises(ValueError, match="Corrupt gzip file .*broken.en.gz"):
        read_lines(path)


def test_read_parallel_pairs_lines(tmp_path):
    (tmp_path / "s.txt").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("x\ny\n", encoding="utf-8")
    assert read_parallel(tmp_path / "s.txt", tmp_path / "t.txt") == [("a", "x"), ("b", "y")]


def test_read_parallel_mismatch_names_files_counts_and_line(tmp_path):
    source = tmp_path / "src.txt"
    target = tmp_path / "tgt.txt"
    source.write_text("1\n2\n3\n", encoding="utf-8")
    target.write_text("1\n2\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        read_parallel(source, target)
    message = str(info.value)
    assert "src.txt has 3 lines" in message
    assert "tgt.txt has 2 lines" in message
    assert "line 3" in message


def test_load_multi30k_from_data_dir(multi30k_dir):
    pairs = load_multi30k("en", "de", "val", data_dir=multi30k_dir)
    assert len(pairs) == 1014
    assert pairs[0] == (
        "A group of men are loading cotton onto a truck",
        "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
    )
    reverse = load_multi30k("de", "en", "validation", data_dir=multi30k_dir)
    assert reverse == [(t, s) for s, t in pairs]


def test_load_multi30k_test_alias_and_french(multi30k_dir):
    pairs = load_multi30k("en", "fr", "test", data_dir=multi30k_dir)
    assert len(pairs) == 1000
    assert pairs == load_multi30k("en", "fr", "test_2016_flickr", data_dir=str(multi30k_dir))
    assert pairs[0][1] == "Un homme avec un chapeau orange regardant quelque chose."


def test_load_multi30k_reads_uncompressed_files(tmp_path):
    (tmp_path / "val.en").write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    (tmp_path / "val.de").write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    assert load_multi30k("en", "de", "val", data_dir=tmp_path) == [
        ("A dog.", "Ein Hund."),
        ("Two cats.", "Zwei Katzen."),
    ]


def test_load_multi30k_missing_local_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.en.gz"):
        load_multi30k("en", "de", "train", data_dir=tmp_path)


@pytest.mark.parametrize(
    "src, tgt, split, pattern",
    [
        ("en", "xx", "val", "Unknown Multi30k target language 'xx'; valid languages: en, de, fr"),
        ("es", "de", "val", "Unknown Multi30k source language 'es'; valid languages: en, de, fr"),
        (
            "en",
            "de",
            "dev",
            "Unknown Multi30k split 'dev'; valid splits: train, val, test_2016_flickr",
        ),
        ("de", "de", "val", "both 'de'"),
    ],
)
def test_load_multi30k_rejects_bad_arguments(tmp_path, src, tgt, split, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_multi30k(src, tgt, split, data_dir=tmp_path)


def test_multi30k_url_is_the_public_raw_directory():
    assert MULTI30K_URL == (
        "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
    )


def test_load_multi30k_downloads_into_cache(tmp_path, multi30k_dir):
    cache = tmp_path / "cache"
    pairs = load_multi30k("en", "de", "val", cache_dir=cache, base_url=multi30k_dir.as_uri())
    assert pairs == load_multi30k("en", "de", "val", data_dir=multi30k_dir)
    assert sorted(p.name for p in cache.iterdir()) == ["val.de.gz", "val.en.gz"]
    assert (cache / "val.de.gz").read_bytes() == (multi30k_dir / "val.de.gz").read_bytes()
    # A second call reads the cache and does not download again.
    empty_server = tmp_path / "server"
    empty_server.mkdir()
    again = load_multi30k("en", "de", "val", cache_dir=cache, base_url=empty_server.as_uri())
    assert again == pairs


def test_load_multi30k_failed_download_leaves_no_file(tmp_path):
    server = tmp_path / "server"
    server.mkdir()
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match=r"Could not download .*/val\.en\.gz"):
        load_multi30k("en", "de", "val", cache_dir=cache, base_url=server.as_uri())
    assert list(cache.iterdir()) == []
