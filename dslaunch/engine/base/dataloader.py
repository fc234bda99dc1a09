"""``RepeatingLoader`` (DeepSpeed's ``deepspeed.utils.RepeatingLoader``): a data loader that never
runs out, for ``PipelineEngine.train_batch(data_iter)``, which pulls as many micro-batches as it
needs and knows nothing of epochs."""

from __future__ import annotations


class RepeatingLoader:
    """Iterates ``loader`` endlessly: when an epoch ends, a new ``iter(loader)`` starts the next
    one (so a ``DataLoader`` reshuffles; a ``DistributedSampler``'s epoch is the caller's to set,
    as with DeepSpeed). An empty loader raises ``StopIteration`` rather than spin forever."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
