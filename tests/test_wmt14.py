"""Tests for load_wmt14, with TFDS's own mock-data utility standing in for the download."""

from __future__ import annotations

import sys

import pytest

from keras_transformer.data.corpus import load_wmt14

# (other language, English): served as German by the de-en config and as
# French by the fr-en config; only the field routing is under test.
EXAMPLES = [
    ("Guten Morgen.", "Good morning."),
    ("Wie geht es dir?", "How are you?"),
    ("Danke schön.", "Thank you very much."),
]


def _fixed_examples(calls: list):
    """An ``as_dataset_fn`` for tfds.testing.mock_data that serves EXAMPLES."""
    import tensorflow as tf

    def as_dataset(builder, split, **kwargs):
        calls.append((builder.name, builder.builder_config.name, str(split)))
        other = next(lang for lang in builder.builder_config.name.split("-") if lang != "en")
        return tf.data.Dataset.from_tensor_slices(
            {
                other: [foreign for foreign, _ in EXAMPLES],
                "en": [english for _, english in EXAMPLES],
            }
        )

    return as_dataset


def test_load_wmt14_en_de_and_reverse():
    tfds = pytest.importorskip("tensorflow_datasets")
    calls = []
    with tfds.testing.mock_data(as_dataset_fn=_fixed_examples(calls)):
        en_de = load_wmt14("en", "de", "train")
        de_en = load_wmt14("de", "en", "val")
    assert en_de == [(english, foreign) for foreign, english in EXAMPLES]
    assert de_en == EXAMPLES
    assert calls == [
        ("wmt14_translate", "de-en", "train"),
        ("wmt14_translate", "de-en", "validation"),
    ]


def test_load_wmt14_fr_config_and_max_examples():
    tfds = pytest.importorskip("tensorflow_datasets")
    calls = []
    with tfds.testing.mock_data(as_dataset_fn=_fixed_examples(calls)):
        pairs = load_wmt14("fr", "en", "test", max_examples=2)
    assert pairs == EXAMPLES[:2]
    assert calls == [("wmt14_translate", "fr-en", "test")]


def test_load_wmt14_with_generated_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=5):
        pairs = load_wmt14("en", "fr", "train")
    assert len(pairs) == 5
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)


@pytest.mark.parametrize(
    "src, tgt, split, pattern",
    [
        ("en", "cs", "train", "Unsupported WMT'14 language pair 'en' -> 'cs'"),
        ("de", "fr", "train", "Unsupported WMT'14 language pair 'de' -> 'fr'"),
        ("en", "en", "train", "Unsupported WMT'14 language pair 'en' -> 'en'"),
        ("en", "de", "dev", "Unknown WMT'14 split 'dev'; valid splits: train, validation, test"),
    ],
)
def test_load_wmt14_rejects_bad_arguments(src, tgt, split, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_wmt14(src, tgt, split)


def test_load_wmt14_rejects_bad_max_examples():
    with pytest.raises(
        ValueError, match="max_examples must be a positive integer. Received: max_examples=0"
    ):
        load_wmt14("en", "de", "train", max_examples=0)


def test_load_wmt14_without_tensorflow_datasets(monkeypatch):
    # A None entry in sys.modules makes `import tensorflow_datasets` fail, as
    # it does where the package is not installed.
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"pip install keras-transformer-toolkit\[wmt\]"):
        load_wmt14("en", "de", "test")
