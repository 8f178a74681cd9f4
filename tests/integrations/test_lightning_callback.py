"""ampcert.integrations.lightning on a real (tiny) Lightning Trainer, on the CPU."""

from __future__ import annotations

import json

import pytest

L = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from ampcert import mllog, track  # noqa: E402
from ampcert.amp import DynamicLossScaler  # noqa: E402
from ampcert.amp.torch import autocast as torch_autocast  # noqa: E402
from ampcert.integrations.lightning import AmpcertCallback, AmpcertPrecision, trainer_precision  # noqa: E402

BATCH = 8


@pytest.fixture(autouse=True)
def _setup(monkeypatch, tmp_path):
    for name in ("AMPCERT_PRECISION", "AMPCERT_SEED", "AMPCERT_AMP", "AMPCERT_DEVICE", "PL_GLOBAL_SEED",
                 "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AMPCERT_MLLOG", str(tmp_path / "run.mllog"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the machine is shared
    yield
    torch.set_num_threads(threads)


class Tiny(L.LightningModule):
    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.encoder = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 2)
        self.fail_at = fail_at
        self.autocast_seen: list[tuple[bool, bool]] = []

    def forward(self, ids):
        self.autocast_seen.append((torch.is_autocast_enabled("cpu"), torch_autocast.is_autocast_enabled("cpu")))
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("the job failed")
        ids, labels = batch
        return torch.nn.functional.cross_entropy(self(ids), labels)

    def validation_step(self, batch, batch_idx):
        ids, labels = batch
        self.log("val_accuracy", (self(ids).argmax(-1) == labels).float().mean())
        self.log("val_loss", torch.nn.functional.cross_entropy(self(ids), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n: int, **kwargs):
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(4, 32, (n, 8), generator=g)
    data = torch.utils.data.TensorDataset(ids, (ids == 5).any(dim=1).long())
    return torch.utils.data.DataLoader(data, **kwargs)


def fit(tmp_path, *, steps=4, module=None, callback=None, sanity=0, **trainer_kwargs):
    torch.manual_seed(0)
    module = module or Tiny()
    callback = callback or AmpcertCallback()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, val_check_interval=2,
                        check_val_every_n_epoch=None, num_sanity_val_steps=sanity, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), callbacks=[callback], **trainer_kwargs)
    trainer.fit(module, loader(64, batch_size=BATCH), loader(16, batch_size=16))
    return trainer, module, callback


def events(tmp_path) -> list[dict]:
    text = (tmp_path / "run.mllog").read_text().splitlines()
    return [json.loads(line.removeprefix(":::MLLOG ")) for line in text]


def by_key(evs: list[dict]) -> dict[str, dict]:
    return {e["key"]: e for e in evs}


def test_an_fp32_run_logs_the_keys_and_discloses_fp32(tmp_path):
    L.seed_everything(9, verbose=False)
    fit(tmp_path, precision="32-true", sanity=1)  # the sanity check's validation is not logged
    evs = events(tmp_path)
    assert [e["key"] for e in evs] == [
        "seed", "global_batch_size", "run_start", mllog.LOWEST_PRECISION_LINEAR, mllog.LOWEST_PRECISION_ATTN,
        mllog.LOWEST_PRECISION_COMM, "eval_accuracy", "eval_accuracy", "run_stop"]
    keyed = by_key(evs)
    assert keyed["seed"]["value"] == 9 and keyed["global_batch_size"]["value"] == BATCH
    assert [e["metadata"]["samples_count"] for e in evs if e["key"] == "eval_accuracy"] == [2 * BATCH, 4 * BATCH]
    assert all(e["metadata"]["epoch_num"] == 0 for e in evs if e["key"] == "eval_accuracy")
    assert keyed["run_stop"]["metadata"] == {"status": "success"}
    linear, attn = keyed[mllog.LOWEST_PRECISION_LINEAR], keyed[mllog.LOWEST_PRECISION_ATTN]
    assert linear["value"] == "fp32" and {"addmm", "mm"} <= set(linear["metadata"]["ops"])  # forward + backward
    assert attn["value"] == "fp32" and attn["metadata"]["observed"] is True


def test_a_bf16_mixed_run_discloses_bfloat16(tmp_path):
    _, module, _ = fit(tmp_path, precision="bf16-mixed")
    keyed = by_key(events(tmp_path))
    assert keyed[mllog.LOWEST_PRECISION_LINEAR]["value"] == "bfloat16"
    assert keyed[mllog.LOWEST_PRECISION_ATTN]["value"] == "bfloat16"
    assert set(module.autocast_seen) == {(True, False)}  # Lightning's torch.autocast


def test_ampcert_precision_trains_under_ampcerts_autocast_and_discloses_bfloat16(tmp_path):
    trainer, module, _ = fit(tmp_path, plugins=[AmpcertPrecision("bf16-mixed", "cpu")])
    assert set(module.autocast_seen) == {(True, True)}  # ampcert's (its dispatcher engine turns torch's on beneath)
    keyed = by_key(events(tmp_path))
    assert keyed[mllog.LOWEST_PRECISION_LINEAR]["value"] == "bfloat16"
    assert keyed[mllog.LOWEST_PRECISION_ATTN]["value"] == "bfloat16"
    assert len([e for e in events(tmp_path) if e["key"] == "eval_accuracy"]) == 2
    assert trainer.global_step == 4


def test_ampcert_precision_fp16_scales_with_ampcerts_scaler(tmp_path):
    plugin = AmpcertPrecision("16-mixed", "cpu")
    assert isinstance(plugin.scaler, DynamicLossScaler)
    trainer, module, _ = fit(tmp_path, steps=2, plugins=[plugin])
    assert set(module.autocast_seen) == {(True, True)}
    assert by_key(events(tmp_path))[mllog.LOWEST_PRECISION_LINEAR]["value"] == "fp16"
    assert plugin.scaler.trajectory()  # it recorded its steps


def test_trainer_precision_follows_the_environment(monkeypatch):
    assert trainer_precision() == {"precision": "32-true"}
    monkeypatch.setenv("AMPCERT_PRECISION", "bf16")
    assert trainer_precision() == {"precision": "bf16-mixed"}
    monkeypatch.setenv("AMPCERT_AMP", "ampcert")
    (plugin,) = trainer_precision(device="cpu")["plugins"]
    assert isinstance(plugin, AmpcertPrecision) and plugin.precision == "bf16-mixed" and plugin.device == "cpu"
    monkeypatch.setenv("AMPCERT_PRECISION", "bf16-true")  # a recipe: Lightning's own flag, amp or not
    assert trainer_precision() == {"precision": "bf16-true"}
    with pytest.raises(ValueError, match="fp8"):
        trainer_precision(track.Env(precision="fp8"))
    with pytest.raises(ValueError, match="bf16-state"):
        trainer_precision(track.Env(precision="bf16-state"))


def test_another_metric_is_named_and_an_exception_aborts_the_run(tmp_path):
    with pytest.raises(RuntimeError, match="the job failed"):
        fit(tmp_path, module=Tiny(fail_at=3), callback=AmpcertCallback(monitor="val_loss", metric="loss"))
    evs = events(tmp_path)
    (evaluation,) = [e for e in evs if e["key"] == "eval_accuracy"]
    assert evaluation["metadata"]["metric"] == "loss" and evaluation["metadata"]["samples_count"] == 2 * BATCH
    assert evs[-1]["key"] == "run_stop" and evs[-1]["metadata"] == {"status": "aborted"}


def test_outside_ampcert_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("AMPCERT_MLLOG")
    _, _, callback = fit(tmp_path, steps=2)
    assert not callback.tracker.active and not (tmp_path / "run.mllog").exists()
