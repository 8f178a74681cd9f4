"""An HF Transformers job that reports to ampcert: a tiny BERT, built from a
config (no downloads), learns whether a marker token occurs in a sequence of
random tokens (synthetic data, made here).

    python examples/own_job/hf_trainer.py               # fp32, writes no MLLOG
    AMPCERT_MLLOG=run.mllog AMPCERT_PRECISION=bf16 AMPCERT_SEED=1 python examples/own_job/hf_trainer.py

It reads ampcert's settings (ampcert.track.env()): bf16=True when
AMPCERT_PRECISION is bf16 (fp16=True for fp16), the seed from AMPCERT_SEED,
the device from AMPCERT_DEVICE. AmpcertCallback writes the MLLOG.
EXAMPLE_IGNORE_PRECISION=1 makes the job train fp32 whatever it is asked
(to show that the precision disclosure catches it).
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import ampcert.track
from ampcert.integrations.hf import AmpcertCallback

VOCAB, LENGTH, MARKER = 64, 12, 5   # tokens 0-3 are special (pad, CLS, ...), 5 is the marker
STEPS, BATCH, EVAL_EVERY = 96, 32, 16
NOISE = 0.1


class Sequences(torch.utils.data.Dataset):
    """Random tokens after a CLS token; label 1 (half of them) where the marker occurs, but
    with 10% of the labels flipped: the best accuracy is about 0.9, and it varies a little
    from seed to seed (an equivalence test needs some spread), in fp32 and bf16 alike."""

    def __init__(self, n: int, seed: int):
        rng = np.random.default_rng(seed)
        ids = rng.integers(6, VOCAB, size=(n, LENGTH))
        labels = rng.integers(0, 2, size=n)
        where = rng.integers(1, LENGTH, size=n)
        ids[labels == 1, where[labels == 1]] = MARKER
        ids[:, 0] = 1  # CLS
        labels = np.where(rng.random(n) < NOISE, 1 - labels, labels)
        self.ids, self.labels = torch.as_tensor(ids), torch.as_tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def main() -> int:
    cfg = ampcert.track.env()
    seed = cfg.seed if cfg.seed is not None else 0
    ignore = os.environ.get("EXAMPLE_IGNORE_PRECISION") == "1"
    precision = "fp32" if ignore else cfg.precision
    if precision not in ("fp32", "bf16", "fp16"):
        print(f"hf_trainer.py: precision {precision} is not supported by this example", file=sys.stderr)
        return 2
    # A model this small computes fastest on one thread (and two spinning threads on a busy
    # 2-core machine run it ~50x slower); OMP_NUM_THREADS, where set, decides.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cpu = (cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu"
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=LENGTH, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    # HF wants an output folder; with save_strategy="no" it writes nothing there.
    out = cfg.run_dir or os.path.join(tempfile.gettempdir(), "ampcert_hf_trainer_example")
    args = TrainingArguments(
        output_dir=str(out), seed=seed, use_cpu=cpu, max_steps=STEPS, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=256, learning_rate=2e-3, warmup_steps=8, weight_decay=0.0,
        eval_strategy="steps", eval_steps=EVAL_EVERY, logging_strategy="no", save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        # With AMPCERT_AMP=ampcert and bf16, AmpcertCallback puts ampcert's autocast on model.forward
        # instead of HF's (HF's bf16 stays off); fp16 keeps fp16=True for HF's GradScaler.
        bf16=precision == "bf16" and cfg.amp == "native", fp16=precision == "fp16")
    callback = AmpcertCallback(amp="native" if ignore else None)  # ignoring: no ampcert autocast either
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(4096, seed + 1000),
                      eval_dataset=Sequences(512, seed + 2000), compute_metrics=accuracy, callbacks=[callback])
    trainer.train()
    final = [h["eval_accuracy"] for h in trainer.state.log_history if "eval_accuracy" in h][-1]
    print(f"hf_trainer.py: precision={precision} seed={seed} final eval_accuracy={final}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
