"""Where a run's input stands, and how a resumed run's input continues from there.

The position is one number, kept in the checkpoint: the global batches the input has
delivered so far (every replica's, every accumulated micro-batch, for applied and skipped
updates alike). A `data.BatchPlan` (what `train_translation` trains on) turns it into
(epoch, offset in that epoch's planned batches) and starts there directly, so a restart
costs the same at update 100 and at update 100,000, and a resume with another number of
replicas or `accum_steps` continues with the same examples. Any other input, a function
`input_context -> dataset`, is replayed: each input pipeline skips its share of the
batches drawn, a cost that grows with the updates done.
"""

from absl import logging


class ReplayedInput:
    """A plain `input_context -> dataset` function resumed by skipping the batches already drawn."""

    def __init__(self, dataset_fn):
        self._dataset_fn = dataset_fn

    def dataset_fn(self, batches_drawn):
        def resumed(input_context):
            # The pipelines share the global batches evenly (each feeds its replicas in turn).
            consumed = batches_drawn // max(input_context.num_input_pipelines, 1)
            dataset = self._dataset_fn(input_context)
            if consumed:
                logging.info(
                    "Resuming the input by replaying %d batches (a data.BatchPlan resumes directly)",
                    consumed,
                )
                dataset = dataset.skip(consumed)
            return dataset

        return resumed


def resumable(train_input):
    """`train_input` as an object with `dataset_fn(batches_drawn) -> (input_context -> dataset)`."""
    return train_input if hasattr(train_input, "dataset_fn") else ReplayedInput(train_input)
