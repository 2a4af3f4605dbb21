"""Attention heatmaps of a translation: encoder self-attention, decoder self-attention and
encoder-decoder (cross) attention, per layer and head, written as PNG files.

The weights come from one teacher-forced pass: the source is encoded, and the decoder is
run once on `[BOS] + output[:-1]`, where `output` is the translation's token ids (EOS
included) — exactly the inputs the decoder saw while producing them. Row t of a decoder
map therefore belongs to the position that *produced* output piece t; it is labelled with
that piece. The keys of decoder self-attention are the decoder inputs (`<s>`, y1, ...).

Shape letters: H heads, S source pieces (EOS included), T output pieces.
"""

import dataclasses
import math

import numpy as np

from keras_transformer import fs

KINDS = ("encoder", "decoder", "cross")
"""Attention kinds: encoder self-attention, decoder (masked) self-attention, encoder-decoder."""

_KIND_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "encoder-decoder attention",
}
_FILE_KINDS = {"encoder": "encoder", "decoder": "decoder_self", "cross": "cross"}


@dataclasses.dataclass
class AttentionMaps:
    """The attention weights of one sentence pair, as NumPy arrays.

    Attributes:
        source_pieces: the S source pieces (ending with `</s>`).
        target_pieces: the T output pieces (ending with `</s>` when EOS was produced).
        decoder_input_pieces: the T decoder inputs, `<s>` then `target_pieces[:-1]`.
        encoder: per encoder layer, `(H, S, S)` (rows: queries, columns: keys).
        decoder: per decoder layer, `(H, T, T)` masked self-attention.
        cross: per decoder layer, `(H, T, S)` encoder-decoder attention.
        source: the source text.
        translation: the target text.
    """

    source_pieces: list
    target_pieces: list
    decoder_input_pieces: list
    encoder: list
    decoder: list
    cross: list
    source: str
    translation: str

    def layer_maps(self, kind):
        """The per-layer arrays of `kind` ("encoder", "decoder" or "cross")."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}. Received: kind={kind!r}")
        return getattr(self, kind)

    def labels(self, kind):
        """`(row_labels, column_labels)` of the maps of `kind`."""
        if kind == "encoder":
            return self.source_pieces, self.source_pieces
        if kind == "decoder":
            return self.target_pieces, self.decoder_input_pieces
        return self.target_pieces, self.source_pieces


def attention_maps(
    model, tokenizer, source, target=None, target_ids=None, translator=None, max_source_length=None
):
    """Attention weights of every layer and head for one source sentence and its translation.

    Args:
        model: a `Transformer`.
        tokenizer: its `data.Tokenizer` (pieces come from `tokenizer.id_to_piece`).
        source: the source sentence.
        target: a target sentence to force (e.g. a reference); it is tokenized and EOS
            appended.
        target_ids: output token ids to force (BOS excluded, EOS included), e.g. from
            `Translator.output_ids`. Takes precedence over `target`.
        translator: with neither `target` nor `target_ids`, the `decoding.Translator`
            that translates `source` (default: greedy search).
        max_source_length: truncate the source (default: the model's `max_length`).

    Returns:
        an `AttentionMaps`.

    Example:

    >>> from keras_transformer.runs import load_run
    >>> model, tokenizer, config = load_run("runs/builtin_tiny")
    >>> maps = attention_maps(model, tokenizer, "twenty one", target="einundzwanzig")
    >>> maps.source_pieces
    ['▁twenty', '▁one', '</s>']
    >>> [m.shape for m in maps.cross]  # (H, T, S) per decoder layer
    [(4, 9, 3), (4, 9, 3)]
    """
    import tensorflow as tf

    from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
    from keras_transformer.decoding.steps import model_source_inputs
    from keras_transformer.decoding.text import encode_source

    max_source_length = max_source_length or model.config.max_length
    source_ids = encode_source(tokenizer, [source], max_source_length)  # (1, S)
    if target_ids is None:
        if target is not None:
            target_ids = [
                int(i) for i in tokenizer.tokenize_target(tf.constant([target])).to_list()[0]
            ] + [EOS_ID]
        else:
            if translator is None:
                from keras_transformer.decoding.translator import Translator

                translator = Translator(
                    model, tokenizer, "greedy", max_source_length=max_source_length
                )
            target_ids = translator.output_ids([source])[0]
    target_ids = [int(i) for i in target_ids if int(i) != PAD_ID]
    if not target_ids:
        raise ValueError("The translation is empty: there is no decoder position to show")
    decoder_inputs = np.array([[BOS_ID] + target_ids[:-1]], np.int32)  # (1, T)

    encoder_scores = model.encoder_attention_scores(source_ids)
    encoder_outputs, source_mask = model.encode(source_ids)
    extra = model_source_inputs(model, source_ids)  # e.g. the parsing model's word positions
    _, decoder_scores = model.decode(
        decoder_inputs, encoder_outputs, source_mask, return_attention_scores=True, **extra
    )

    def to_numpy(tensor):
        return np.asarray(tensor, np.float32)[0]

    def pieces(ids, target=True):
        return [tokenizer.id_to_piece(int(i), target=target) for i in ids]

    translation = tokenizer.detokenize(np.array([target_ids], np.int32)).numpy()[0].decode("utf-8")
    return AttentionMaps(
        source_pieces=pieces(np.asarray(source_ids)[0], target=False),
        target_pieces=pieces(target_ids),
        decoder_input_pieces=pieces(decoder_inputs[0]),
        encoder=[to_numpy(scores) for scores in encoder_scores],
        decoder=[to_numpy(scores["self"]) for scores in decoder_scores],
        cross=[to_numpy(scores["cross"]) for scores in decoder_scores],
        source=source,
        translation=translation,
    )


def grid_shape(num_heads, max_columns=4):
    """`(rows, columns)` of the grid of heads in one figure."""
    columns = min(num_heads, max_columns)
    return math.ceil(num_heads / columns), columns


def figure_size(num_heads, num_rows, num_columns, cell_size=0.3, max_columns=4):
    """Figure size in inches `(width, height)` of a grid of `num_heads` maps with
    `num_rows` x `num_columns` cells each (room for the labels, titles and colorbar)."""
    grid_rows, grid_columns = grid_shape(num_heads, max_columns)
    width = grid_columns * (max(num_columns, 3) * cell_size + 1.4) + 0.9
    height = grid_rows * (max(num_rows, 3) * cell_size + 1.5) + 0.5
    return round(width, 2), round(height, 2)


def plot_attention_heads(
    scores,
    row_labels,
    column_labels,
    path,
    title=None,
    row_title="query",
    column_title="key",
    dpi=100,
    cell_size=0.3,
    max_columns=4,
):
    """Write a grid of heatmaps, one per head, of attention weights `(H, Q, K)` to a PNG.

    Colors share one scale, 0 to 1 (a row of each map sums to 1).

    Args:
        scores: array `(H, Q, K)`.
        row_labels: Q query labels; column_labels: K key labels.
        path: the PNG file to write (parent directories are created).
        title: the figure title.
        row_title, column_title: axis titles.
        dpi: resolution; the image is `figure_size(...) * dpi` pixels.
        cell_size: inches per attention cell.
        max_columns: heads per row of the grid.

    Returns:
        the written path.
    """
    from matplotlib.figure import Figure

    scores = np.asarray(scores, np.float32)
    if scores.ndim != 3:
        raise ValueError(
            f"scores must have shape (heads, queries, keys). Received: shape={scores.shape}"
        )
    num_heads, num_rows, num_columns = scores.shape
    if len(row_labels) != num_rows or len(column_labels) != num_columns:
        raise ValueError(
            f"Expected {num_rows} row and {num_columns} column labels for scores of shape {scores.shape}. "
            f"Received: {len(row_labels)} and {len(column_labels)}"
        )
    grid_rows, grid_columns = grid_shape(num_heads, max_columns)
    # A Figure not registered with pyplot renders with the Agg canvas: no backend switch,
    # no screen, no global figure registry (freed with the object).
    figure = Figure(
        figsize=figure_size(num_heads, num_rows, num_columns, cell_size, max_columns),
        dpi=dpi,
        layout="constrained",
    )
    axes = figure.subplots(grid_rows, grid_columns, squeeze=False)
    font_size = 8 if max(num_rows, num_columns) <= 30 else 6
    image = None
    for head, ax in enumerate(axes.flat):
        if head >= num_heads:
            ax.set_axis_off()
            continue
        image = ax.imshow(
            scores[head],
            cmap="viridis",
            vmin=0.0,
            vmax=1.0,
            aspect="equal",
            interpolation="nearest",
        )
        ax.set_title(f"head {head}", fontsize=9)
        ax.set_xticks(range(num_columns))
        ax.set_xticklabels(column_labels, rotation=90, fontsize=font_size)
        ax.set_yticks(range(num_rows))
        ax.set_yticklabels(row_labels, fontsize=font_size)
        ax.set_xlabel(column_title, fontsize=8)
        ax.set_ylabel(row_title, fontsize=8)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=10)
    return fs.write_from(path, lambda file: figure.savefig(file, dpi=dpi, format="png"))


def plot_attention(maps, output_dir, prefix="attention", kinds=KINDS, layers=None, dpi=100):
    """Write one PNG per attention kind and layer, each a grid of the layer's heads.

    Files: `<prefix>_encoder_layer<i>.png`, `<prefix>_decoder_self_layer<i>.png`,
    `<prefix>_cross_layer<i>.png` (layers counted from 0).

    Args:
        maps: an `AttentionMaps` (see `attention_maps`).
        output_dir: directory for the PNG files (created).
        prefix: file name prefix.
        kinds: among "encoder", "decoder", "cross".
        layers: layer indices to plot (default: all).
        dpi: resolution.

    Returns:
        the written paths, in order.
    """
    paths = []
    for kind in kinds:
        layer_maps = maps.layer_maps(kind)
        row_labels, column_labels = maps.labels(kind)
        indices = range(len(layer_maps)) if layers is None else layers
        for index in indices:
            if not 0 <= index < len(layer_maps):
                raise ValueError(
                    f"layer {index} does not exist: the model has {len(layer_maps)} {kind} layers"
                )
            row_title, column_title = {
                "encoder": ("source (query)", "source (key)"),
                "decoder": ("output piece (query)", "decoder input (key)"),
                "cross": ("output piece (query)", "source (key)"),
            }[kind]
            path = fs.join(output_dir, f"{prefix}_{_FILE_KINDS[kind]}_layer{index}.png")
            title = f"{_KIND_TITLES[kind]}, layer {index}: {maps.source} → {maps.translation}"
            paths.append(
                plot_attention_heads(
                    layer_maps[index],
                    row_labels,
                    column_labels,
                    path,
                    title,
                    row_title,
                    column_title,
                    dpi=dpi,
                )
            )
    return paths
