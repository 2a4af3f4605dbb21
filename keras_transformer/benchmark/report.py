"""The benchmark table as text and as a bar chart."""

import numpy as np

# Characters of the name column: every row's name fits (`benchmark.rows`).
NAME_WIDTH = 70


def format_row(row):
    """One row as a fixed-width line, with "ok"/"MISSED" against its target (`format_table`'s columns)."""
    name, ours_value, peer_value, ratio, target = row
    if target is None:
        return f"{name:{NAME_WIDTH}s} {ours_value:12.2f} {peer_value:12.2f} {ratio:8.2f} {'-':>8s}"
    mark = "ok" if ratio >= target else "MISSED"
    return f"{name:{NAME_WIDTH}s} {ours_value:12.2f} {peer_value:12.2f} {ratio:8.2f} {target:8.2f} {mark}"


def format_table(rows):
    """The rows as a fixed-width table under a header, one line each."""
    header = f"{'measurement':{NAME_WIDTH}s} {'ours':>12s} {'peer/base':>12s} {'ratio':>8s} {'target':>8s}"
    return "\n".join([header] + [format_row(row) for row in rows])


def plot_ratios(rows, path):
    """Bar chart of each row's ratio beside its target, labelled by the rows' keys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name.partition(":")[0] for name, *_ in rows]
    ratios = [ratio for _, _, _, ratio, _ in rows]
    targets = [target for *_, target in rows]
    figure, axis = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    positions = np.arange(len(rows))
    axis.barh(positions, ratios, color="tab:blue", label="measured ratio")
    with_target = [index for index, target in enumerate(targets) if target is not None]
    axis.scatter(
        [targets[i] for i in with_target],
        positions[with_target],
        color="tab:red",
        marker="|",
        s=400,
        label="target",
    )
    axis.set_yticks(positions, names)
    axis.invert_yaxis()
    axis.set_xlabel("ratio (ours / peer or base)")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
