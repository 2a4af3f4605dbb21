"""Evaluation: sacreBLEU BLEU/chrF, evaluating runs and SavedModels (decoding speed: `keras_transformer.benchmark`).

Example:

>>> from keras_transformer.evaluation import score_corpus
>>> scores = score_corpus(["the cat sat on the mat"], ["the cat sat on the mat"])
>>> round(scores.bleu, 2), round(scores.chrf, 2), scores.exact_match
(100.0, 100.0, 1.0)
"""

from keras_transformer.evaluation.bleu import (
    TOKENIZERS,
    CorpusScores,
    corpus_bleu,
    corpus_chrf,
    score_corpus,
)
from keras_transformer.evaluation.evaluate import (
    CheckpointScore,
    EvaluationResult,
    default_tokenize,
    evaluate_run,
    evaluate_saved_model,
    evaluate_translator,
    score_checkpoints,
    write_lines,
)
from keras_transformer.runs import checkpoint_step

__all__ = [
    "TOKENIZERS",
    "CheckpointScore",
    "CorpusScores",
    "EvaluationResult",
    "checkpoint_step",
    "corpus_bleu",
    "corpus_chrf",
    "default_tokenize",
    "evaluate_run",
    "evaluate_saved_model",
    "evaluate_translator",
    "score_checkpoints",
    "score_corpus",
    "write_lines",
]
