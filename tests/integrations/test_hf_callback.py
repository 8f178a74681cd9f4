"""ampcert.integrations.hf.AmpcertCallback on a real (tiny) HF Trainer, on the CPU."""

from __future__ import annotations

import json
import warnings

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from ampcert import mllog  # noqa: E402
from ampcert.amp.torch import autocast as torch_autocast  # noqa: E402
from ampcert.integrations.hf import AmpcertCallback  # noqa: E402

BATCH = 8


@pytest.fixture(autouse=True)
def _setup(monkeypatch, tmp_path):
    for name in ("AMPCERT_PRECISION", "AMPCERT_SEED", "AMPCERT_AMP", "AMPCERT_DEVICE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AMPCERT_MLLOG", str(tmp_path / "run.mllog"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the machine is shared
    yield
    torch.set_num_threads(threads)


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(4, 32, (n, 8), generator=g)
        self.labels = (self.ids == 5).any(dim=1).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def train(tmp_path, *, steps=4, metrics=True, callback=None, **arguments):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=8, num_labels=2))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, seed=5, max_steps=steps, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=32, eval_strategy="steps", eval_steps=2, logging_strategy="no",
        save_strategy="no", report_to="none", disable_tqdm=True, **arguments)
    callback = callback or AmpcertCallback()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(64), eval_dataset=Data(32),
                                   compute_metrics=accuracy if metrics else None, callbacks=[callback])
    trainer.train()
    return trainer, callback


def events(tmp_path) -> list[dict]:
    text = (tmp_path / "run.mllog").read_text().splitlines()
    return [json.loads(line.removeprefix(":::MLLOG ")) for line in text]


def by_key(evs: list[dict]) -> dict[str, dict]:
    return {e["key"]: e for e in evs}


def test_an_fp32_run_logs_the_keys_and_discloses_fp32(tmp_path):
    train(tmp_path)
    evs = events(tmp_path)
    assert [e["key"] for e in evs] == [
        "seed", "global_batch_size", "run_start", mllog.LOWEST_PRECISION_LINEAR, mllog.LOWEST_PRECISION_ATTN,
        mllog.LOWEST_PRECISION_COMM, "eval_accuracy", "eval_accuracy", "run_stop"]
    keyed = by_key(evs)
    assert keyed["seed"]["value"] == 5 and keyed["global_batch_size"]["value"] == BATCH
    assert [e["metadata"]["samples_count"] for e in evs if e["key"] == "eval_accuracy"] == [2 * BATCH, 4 * BATCH]
    assert all(0.0 <= e["value"] <= 1.0 and "metric" not in e["metadata"] for e in evs if e["key"] == "eval_accuracy")
    assert keyed["run_stop"]["metadata"] == {"status": "success"}
    linear, attn = keyed[mllog.LOWEST_PRECISION_LINEAR], keyed[mllog.LOWEST_PRECISION_ATTN]
    assert linear["value"] == "fp32" and linear["metadata"]["observed"] is True
    assert attn["value"] == "fp32" and attn["metadata"]["observed"] is True
    # forward and backward both seen: nn.Linear's forward is addmm, its backward mm
    assert {"addmm", "mm"} <= set(linear["metadata"]["ops"])


def test_a_bf16_run_discloses_bfloat16(tmp_path):
    train(tmp_path, bf16=True)
    keyed = by_key(events(tmp_path))
    assert keyed[mllog.LOWEST_PRECISION_LINEAR]["value"] == "bfloat16"
    assert keyed[mllog.LOWEST_PRECISION_ATTN]["value"] == "bfloat16"
    assert keyed[mllog.LOWEST_PRECISION_COMM]["value"] == "fp32"


def test_a_job_declared_bf16_that_trains_fp32_is_warned_and_disclosed_fp32(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPCERT_PRECISION", "bf16")
    with pytest.warns(UserWarning, match="trains in fp32"):
        train(tmp_path, steps=2)
    assert by_key(events(tmp_path))[mllog.LOWEST_PRECISION_LINEAR]["value"] == "fp32"


def _autocast_seen(model) -> list[tuple[bool, bool]]:
    """(torch's autocast on, ampcert's autocast on) inside each forward of the model's encoder."""
    seen: list[tuple[bool, bool]] = []
    model.bert.encoder.register_forward_pre_hook(
        lambda *_: seen.append((torch.is_autocast_enabled("cpu"), torch_autocast.is_autocast_enabled("cpu"))))
    return seen


@pytest.mark.parametrize("hf_bf16", [False, True], ids=["added", "replaces-hf-autocast"])
def test_amp_ampcert_runs_the_forward_under_ampcerts_autocast(tmp_path, monkeypatch, hf_bf16):
    monkeypatch.setenv("AMPCERT_PRECISION", "bf16")
    monkeypatch.setenv("AMPCERT_AMP", "ampcert")

    class Watch(AmpcertCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.seen = _autocast_seen(model)
            return super().on_train_begin(args, state, control, model=model, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "trains in fp32" warning
        trainer, callback = train(tmp_path, steps=2, callback=Watch(), bf16=hf_bf16)
    assert callback.seen and set(callback.seen) == {(True, True)}  # ampcert's (torch's on beneath it)
    assert trainer.model._ampcert_autocast.fast_dtype == torch.bfloat16
    keyed = by_key(events(tmp_path))
    assert keyed[mllog.LOWEST_PRECISION_LINEAR]["value"] == "bfloat16"
    assert keyed[mllog.LOWEST_PRECISION_ATTN]["value"] == "bfloat16"


def test_amp_ampcert_fp16_without_hfs_scaler_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPCERT_PRECISION", "fp16")
    monkeypatch.setenv("AMPCERT_AMP", "ampcert")
    with pytest.raises(ValueError, match="fp16=True"):
        train(tmp_path, steps=1)


def test_without_an_accuracy_the_loss_is_logged_and_named(tmp_path):
    train(tmp_path, steps=2, metrics=False, gradient_accumulation_steps=2)
    evs = events(tmp_path)
    assert by_key(evs)["global_batch_size"]["value"] == 2 * BATCH
    loss = [e for e in evs if e["key"] == "eval_accuracy"]
    assert len(loss) == 1 and loss[0]["metadata"]["metric"] == "loss"
    assert loss[0]["metadata"]["samples_count"] == 2 * 2 * BATCH
    assert by_key(evs)["eval_loss"]["value"] == loss[0]["value"]


def test_outside_ampcert_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("AMPCERT_MLLOG")
    _, callback = train(tmp_path, steps=2)
    assert not callback.tracker.active and not (tmp_path / "run.mllog").exists()
