"""Loads an export and calls every signature, in a clean process: run by `tests/test_export.py`.

The same process then loads the int8 export (`model.quantize("int8")`) and translates with it.

Not a module to import: the test runs it as `python -c TENSORFLOW_ONLY_PRELUDE + <this file>
CASE_JSON OUT_JSON` (`export.ops_check.TENSORFLOW_ONLY_PRELUDE` refuses Keras and
keras_transformer and defines `load_sentencepiece_ops`), with this interpreter or with one
of a clean serving runtime (`tests/runtimes.py`). It needs TensorFlow and TensorFlow Text
only. The inputs come from CASE_JSON (bytes as base64), every result goes to OUT_JSON.
"""

import base64
import json
import sys
from importlib.metadata import version

import tensorflow as tf
from tensorflow.python.framework import op_def_registry

core_only = {
    name: op_def_registry.get(name) is not None for name in ("SentencepieceOp", "ReadVariableOp")
}
load_sentencepiece_ops()  # noqa: F821 (defined by the prelude)

case = json.loads(open(sys.argv[1]).read())


def unb64(items):
    return [base64.b64decode(item) for item in items]


def b64(array):
    return [base64.b64encode(item).decode("ascii") for item in array.tolist()]


loaded = tf.saved_model.load(case["export"])
sig = loaded.signatures
out = {
    "core_only": core_only,
    "runtime": {"tensorflow": tf.__version__, "tensorflow-text": version("tensorflow-text")},
}


def run_text(name, texts, signatures=sig):
    result = signatures[name](text=tf.constant(texts, tf.string))
    return {
        "translation": b64(result["translation"].numpy()),
        "score": result["score"].numpy().tolist(),
        "shapes": [result["translation"].shape.as_list(), result["score"].shape.as_list()],
    }


def error_of(call):
    try:
        call()
    except Exception as err:  # the type and message are what the tests check
        return {"type": type(err).__name__, "message": str(err)}
    return None


sentences = unb64(case["sentences"])
out["translate"] = run_text("translate", sentences)
out["serving_default"] = run_text("serving_default", sentences)
ids = sig["translate_ids"](source_ids=tf.constant(case["source_ids"], tf.int32))
out["translate_ids"] = {
    "token_ids": ids["token_ids"].numpy().tolist(),
    "scores": ids["scores"].numpy().tolist(),
}
nbest = sig["translate_nbest"](text=tf.constant(sentences))
out["translate_nbest"] = {
    "translations": [b64(row) for row in nbest["translations"].numpy()],
    "scores": nbest["scores"].numpy().tolist(),
}
scored = sig["score"](source=tf.constant(sentences), target=tf.constant(unb64(case["targets"])))
out["score"] = scored["log_probability"].numpy().tolist()

odd = unb64(case["odd"])
out["odd_batch"] = run_text("translate", odd)
out["odd_alone"] = [run_text("translate", [text]) for text in odd]
odd_nbest = sig["translate_nbest"](text=tf.constant(odd))
out["odd_nbest"] = {
    "translations": [b64(row) for row in odd_nbest["translations"].numpy()],
    "scores": odd_nbest["scores"].numpy().tolist(),
}
out["replaced"] = run_text("translate", [case["replaced"]])
long_ids = sig["translate_ids"](source_ids=tf.constant(case["long_ids"], tf.int32))
out["long_ids"] = long_ids["token_ids"].numpy().tolist()
dirty = sig["translate_ids"](source_ids=tf.constant(case["dirty_ids"], tf.int32))
clean = sig["translate_ids"](source_ids=tf.constant(case["clean_ids"], tf.int32))
out["dirty_ids"] = [dirty["token_ids"].numpy().tolist(), clean["token_ids"].numpy().tolist()]

empty_text = tf.zeros([0], tf.string)
empty_ids = sig["translate_ids"](source_ids=tf.zeros([0, 0], tf.int32))
out["empty_batch"] = {
    "translate": run_text("translate", empty_text)["shapes"],
    "translate_nbest": [
        value.shape.as_list()
        for _, value in sorted(sig["translate_nbest"](text=empty_text).items())
    ],
    "translate_ids": [value.shape.as_list() for _, value in sorted(empty_ids.items())],
    "score": sig["score"](source=empty_text, target=empty_text)["log_probability"].shape.as_list(),
}
empty_score = sig["score"](source=tf.constant(["", "one"]), target=tf.constant(["", ""]))
out["empty_score"] = empty_score["log_probability"].numpy().tolist()

out["errors"] = {
    "signature_int_text": error_of(lambda: sig["translate"](text=tf.constant([1, 2]))),
    "nbest_int_text": error_of(lambda: sig["translate_nbest"](text=tf.constant([1, 2]))),
    "nbest_rank2_text": error_of(
        lambda: sig["translate_nbest"](text=tf.constant([["one", "two"]]))
    ),
    "signature_rank2_text": error_of(lambda: sig["translate"](text=tf.constant([["one", "two"]]))),
    "signature_scalar_text": error_of(lambda: sig["serving_default"](text=tf.constant("one"))),
    "signature_float_ids": error_of(
        lambda: sig["translate_ids"](source_ids=tf.constant([[5.0, 3.0]]))
    ),
    "signature_rank1_ids": error_of(lambda: sig["translate_ids"](source_ids=tf.constant([5, 3]))),
    "signature_missing_input": error_of(lambda: sig["translate"](txt=tf.constant(["one"]))),
    "score_batch_mismatch": error_of(
        lambda: sig["score"](source=tf.constant(["one", "two"]), target=tf.constant(["eins"]))
    ),
    "function_int_text": error_of(lambda: loaded.translate(tf.constant([1, 2]))),
    "function_rank2_text": error_of(lambda: loaded.translate(tf.constant([["one", "two"]]))),
    "function_float_ids": error_of(lambda: loaded.translate_ids(tf.constant([[5.0, 3.0]]))),
}
out["after_errors"] = run_text("translate", sentences)
out["function_translate"] = {
    "score": loaded.translate(tf.constant(sentences))["score"].numpy().tolist()
}
out["asset_path"] = loaded.tokenizer_model.asset_path.numpy().decode()

int8 = tf.saved_model.load(case["int8_export"]).signatures
int8_ids = int8["translate_ids"](source_ids=tf.constant(case["source_ids"], tf.int32))
out["int8"] = {
    "translate": run_text("translate", sentences, int8),
    "token_ids": int8_ids["token_ids"].numpy().tolist(),
    "scores": int8_ids["scores"].numpy().tolist(),
}
out["modules"] = sorted({name.split(".")[0] for name in sys.modules})
json.dump(out, open(sys.argv[2], "w"))
