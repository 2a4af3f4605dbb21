"""TF Serving warmup requests: `assets.extra/tf_serving_warmup_requests` in a version.

TF Serving replays these records when it loads a version, before the version serves
traffic, so the first real requests do not pay for graph optimization and the creation of
the SentencePiece resource. The file is a TFRecord of serialized
`tensorflow.serving.PredictionLog` protos, each holding a `PredictRequest` for one
signature (TF Serving reads at most 1,000 records).

The protos come from the `tensorflow-serving-api` package (imported when needed).
"""

import tensorflow as tf

from keras_transformer import fs

ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000

DEFAULT_WARMUP_SENTENCES = (
    "Hello!",
    "twenty one thousand three hundred forty five",
    "A man in a blue shirt is standing on a ladder and cleaning the windows of a tall building.",
)


def _serving_protos():
    try:
        from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Writing TF Serving warmup requests needs the `tensorflow-serving-api` package: "
            "pip install 'tensorflow-serving-api>=2.21,<2.22'"
        ) from err
    return model_pb2, predict_pb2, prediction_log_pb2


def check_sentences(sentences):
    """The warmup sentences as a list of UTF-8 bytes.

    Raises:
        TypeError: if `sentences` is a single string or holds something else than str/bytes.
        ValueError: if there is no sentence, or more than TF Serving replays.
    """
    if isinstance(sentences, (str, bytes)):
        raise TypeError(
            f"warmup sentences must be a list of strings, not a single string. Received: {sentences!r}"
        )
    sentences = list(sentences)
    if not sentences:
        raise ValueError("At least one warmup sentence is needed.")
    if len(sentences) > MAX_WARMUP_RECORDS:
        raise ValueError(
            f"TF Serving replays at most {MAX_WARMUP_RECORDS} warmup requests. Received: {len(sentences)} sentences"
        )
    checked = []
    for index, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            sentence = sentence.encode("utf-8")
        if not isinstance(sentence, bytes):
            raise TypeError(
                "warmup sentences must be str or bytes. "
                f"Received: {sentence!r} ({type(sentence).__name__}) at index {index}"
            )
        checked.append(sentence)
    return checked


def warmup_requests(translator, model_name, sentences=DEFAULT_WARMUP_SENTENCES):
    """`PredictionLog` protos that exercise every signature of an exported `translator`.

    One request per signature with all `sentences` as one batch (`serving_default`,
    `translate`, `translate_ids` with the sentences' source ids, `translate_nbest`, `score` with each
    sentence as its own target), and one `serving_default` request with a single
    sentence (the most common request).

    Args:
        translator: the exported `TranslationModule` (encodes the ids of `translate_ids`).
        model_name: the model name TF Serving serves the export under.
        sentences: source texts (str or bytes).

    Returns:
        a list of `tensorflow.serving.PredictionLog`.
    """
    model_pb2, predict_pb2, prediction_log_pb2 = _serving_protos()
    sentences = check_sentences(sentences)
    source_ids = translator.encode(tf.constant(sentences, tf.string)).numpy()  # (B, S)
    requests = [
        ("serving_default", {"text": tf.constant(sentences[:1], tf.string)}),
        ("serving_default", {"text": tf.constant(sentences, tf.string)}),
        ("translate", {"text": tf.constant(sentences, tf.string)}),
        ("translate_ids", {"source_ids": tf.constant(source_ids, tf.int32)}),
        ("translate_nbest", {"text": tf.constant(sentences, tf.string)}),
        (
            "score",
            {
                "source": tf.constant(sentences, tf.string),
                "target": tf.constant(sentences, tf.string),
            },
        ),
    ]
    logs = []
    for signature_name, inputs in requests:
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature_name)
        )
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        logs.append(
            prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
        )
    return logs


def write_warmup_requests(saved_model_dir, logs):
    """Write `logs` to `<saved_model_dir>/assets.extra/tf_serving_warmup_requests`; returns the path."""
    path = fs.join(saved_model_dir, ASSETS_EXTRA, WARMUP_FILE)
    fs.makedirs(fs.parent(path))
    with fs.os_errors(path), tf.io.TFRecordWriter(str(path)) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    return path


def read_warmup_requests(path):
    """Parse a warmup file (or a SavedModel directory holding one) back into `PredictionLog`s."""
    _, _, prediction_log_pb2 = _serving_protos()
    if fs.isdir(path):
        path = fs.join(path, ASSETS_EXTRA, WARMUP_FILE)
    logs = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record.numpy())
        logs.append(log)
    return logs


def replay_warmup_requests(loaded, logs):
    """Run each warmup request through the signatures of a loaded SavedModel, as TF Serving does.

    Args:
        loaded: the result of `tf.saved_model.load`.
        logs: `PredictionLog`s (from `warmup_requests` or `read_warmup_requests`).

    Returns:
        a list with the outputs (dicts of tensors) of each request.

    Raises:
        ValueError: if a request names an unknown signature, or an output does not have
            one row per input row.
    """
    results = []
    for log in logs:
        request = log.predict_log.request
        name = request.model_spec.signature_name or "serving_default"
        if name not in loaded.signatures:
            raise ValueError(
                f"Warmup request for unknown signature {name!r}; the SavedModel has {sorted(loaded.signatures)}"
            )
        inputs = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in request.inputs.items()}
        outputs = loaded.signatures[name](**inputs)
        batch_size = int(next(iter(inputs.values())).shape[0])
        for key, value in outputs.items():
            if value.shape[0] != batch_size:
                raise ValueError(
                    f"Signature {name!r} returned {key} with shape {value.shape} for a batch of {batch_size} inputs"
                )
        results.append(outputs)
    return results
