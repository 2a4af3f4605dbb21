"""Data for translation: corpora, a built-in task, SentencePiece (and Marian's tokenizer pair) and
tf.data batching.

Example:
    >>> from keras_transformer.data import (Tokenizer, builtin_task, make_dataset,
    ...                                     train_sentencepiece)
    >>> pairs = builtin_task("train")
    >>> path = train_sentencepiece([s for pair in pairs for s in pair],
    ...                            "numbers/spm.model", vocabulary_size=128,
    ...                            max_sentences=4000)
    >>> dataset = make_dataset(pairs, Tokenizer(path), batch_tokens=2048,
    ...                        max_length=48)
    >>> inputs, labels = next(iter(dataset))
    >>> sorted(inputs), labels.dtype
    (['source_ids', 'target_ids'], tf.int32)
"""

from keras_transformer.data.builtin_task import builtin_task, english_number, german_number
from keras_transformer.data.corpus import (
    MULTI30K_URL,
    load_multi30k,
    load_wmt14,
    read_lines,
    read_parallel,
)
from keras_transformer.data.marian import MarianTokenizer, marian_id_map, read_marian_files
from keras_transformer.data.pipeline import (
    default_bucket_boundaries,
    make_dataset,
    padding_fraction,
)
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_sentencepiece,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "MULTI30K_URL",
    "MarianTokenizer",
    "PAD_ID",
    "UNK_ID",
    "Tokenizer",
    "builtin_task",
    "default_bucket_boundaries",
    "english_number",
    "german_number",
    "load_multi30k",
    "load_wmt14",
    "make_dataset",
    "marian_id_map",
    "padding_fraction",
    "read_lines",
    "read_marian_files",
    "read_parallel",
    "train_sentencepiece",
]
