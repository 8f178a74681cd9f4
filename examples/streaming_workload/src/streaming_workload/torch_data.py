"""The torch side of the shard folder: an IterableDataset (imports torch; the
workload imports this module only in ``build``, so a JAX-only install never does)."""

from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from streaming_workload import shards


class ShardDataset(IterableDataset):
    """One epoch of a shard folder as (x, y) numpy batches, read a shard at a
    time. Each DataLoader worker reads its own share of the shards (by
    ``get_worker_info``), so no batch is read twice. Defined at module level so
    that a worker started by ``spawn`` can unpickle it."""

    def __init__(self, data_dir: str, batch_size: int, seed: int, epoch: int):
        self.data_dir, self.batch_size, self.seed, self.epoch = data_dir, batch_size, seed, epoch

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return shards.iter_batches(self.data_dir, self.batch_size, self.seed, self.epoch, worker, workers)


def loader(data_dir: str, batch_size: int, seed: int, epoch: int, workers: int = 0) -> DataLoader:
    """The epoch's DataLoader. ``batch_size=None``: the dataset yields whole
    batches, and the loader only turns them into tensors (with ``workers``
    processes reading ahead)."""
    return DataLoader(ShardDataset(data_dir, batch_size, seed, epoch), batch_size=None, num_workers=workers)
