"""A Lightning job that reports to ampcert: a one-layer transformer encoder
learns whether a marker token occurs in a sequence of random tokens
(synthetic data, made here; 10% of the labels flipped, so the best accuracy
is about 0.9).

    python examples/own_job/lightning_job.py               # fp32, writes no MLLOG
    AMPCERT_MLLOG=run.mllog AMPCERT_PRECISION=bf16 AMPCERT_SEED=1 python examples/own_job/lightning_job.py

It reads ampcert's settings (ampcert.track.env()): precision "bf16-mixed" /
"16-mixed" / "32-true" from AMPCERT_PRECISION, or, with AMPCERT_AMP=ampcert,
the AmpcertPrecision plugin (ampcert's autocast); the seed from AMPCERT_SEED.
AmpcertCallback writes the MLLOG.
"""

from __future__ import annotations

import os
import sys

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ampcert.track
from ampcert.integrations.lightning import AmpcertCallback, trainer_precision

VOCAB, LENGTH, MARKER, NOISE = 64, 12, 5, 0.1
STEPS, BATCH, EVAL_EVERY = 96, 32, 16


def sequences(n: int, seed: int) -> TensorDataset:
    """Random tokens; label 1 (half of them) where the marker occurs, 10% of labels flipped."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, VOCAB, (n, LENGTH), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    where = torch.randint(0, LENGTH, (n,), generator=g)
    rows = torch.nonzero(labels == 1).squeeze(1)
    ids[rows, where[rows]] = MARKER
    flip = torch.rand(n, generator=g) < NOISE
    return TensorDataset(ids, torch.where(flip, 1 - labels, labels))


class MarkerClassifier(L.LightningModule):
    def __init__(self, width: int = 64):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.randn(LENGTH, width) * 0.02)
        self.encoder = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=2 * width, dropout=0.0,
                                                  batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids) + self.position).mean(dim=1))

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        return nn.functional.cross_entropy(self(ids), labels)

    def validation_step(self, batch, batch_idx):
        ids, labels = batch
        accuracy = (self(ids).argmax(-1) == labels).float().mean()
        self.log("val_accuracy", accuracy, prog_bar=False)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.0)


def main() -> int:
    cfg = ampcert.track.env()
    seed = cfg.seed if cfg.seed is not None else 0
    # A model this small computes fastest on one thread; OMP_NUM_THREADS, where set, decides.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    L.seed_everything(seed, verbose=False)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    train = DataLoader(sequences(4096, seed + 1000), batch_size=BATCH, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    val = DataLoader(sequences(512, seed + 2000), batch_size=256)
    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=STEPS,
        val_check_interval=EVAL_EVERY, check_val_every_n_epoch=None, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(cfg.run_dir) if cfg.run_dir else None,
        callbacks=[AmpcertCallback(monitor="val_accuracy")], **trainer_precision(cfg, device))
    trainer.fit(MarkerClassifier(), train, val)
    final = float(trainer.callback_metrics["val_accuracy"])
    print(f"lightning_job.py: precision={cfg.precision} amp={cfg.amp} seed={seed} final val_accuracy={final:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
