"""ampcert.track: the MLLOG a plain script writes for an own job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from ampcert import mllog, track
from ampcert.mllog import reader as mllog_reader


def lines(path) -> list[dict]:
    """Each event as MLPerf's tools read it: the JSON after ':::MLLOG '."""
    out = []
    for line in path.read_text().splitlines():
        assert line.startswith(":::MLLOG "), line
        out.append(json.loads(line[len(":::MLLOG "):]))
    return out


def keys(events: list[dict]) -> list[str]:
    return [e["key"] for e in events]


@pytest.fixture(autouse=True)
def _no_ampcert_env(monkeypatch):
    for name in ("AMPCERT_MLLOG", "AMPCERT_PRECISION", "AMPCERT_SEED", "AMPCERT_AMP", "AMPCERT_RUN_DIR",
                 "AMPCERT_RUN_ID", "AMPCERT_DEVICE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_a_run_is_logged_in_mlperfs_format(tmp_path):
    path = tmp_path / "sub" / "run.mllog"
    with track.start(path, seed=3, global_batch_size=64) as tracker:
        assert tracker.active and tracker.path == path
        tracker.eval(0.5, samples=640, epoch=1)
        tracker.eval(2.25, samples=1280, metric="loss")
        tracker.disclose(linear="bf16")
    events = lines(path)
    assert keys(events) == ["seed", "global_batch_size", "run_start", "eval_accuracy", "eval_loss",
                            "eval_accuracy", mllog.LOWEST_PRECISION_LINEAR, mllog.LOWEST_PRECISION_ATTN,
                            mllog.LOWEST_PRECISION_COMM, "run_stop"]
    # mllog's field order, event types and values
    assert list(events[0]) == ["namespace", "time_ms", "event_type", "key", "value", "metadata"]
    assert events[0]["value"] == 3 and events[1]["value"] == 64
    assert events[2]["event_type"] == "INTERVAL_START" and events[-1]["event_type"] == "INTERVAL_END"
    assert events[3]["value"] == 0.5 and events[3]["metadata"] == {"samples_count": 640, "epoch_num": 1}
    assert events[4]["metadata"] == {"samples_count": 1280, "epoch_num": 0}
    assert events[5]["value"] == 2.25
    assert events[5]["metadata"] == {"samples_count": 1280, "epoch_num": 0, "metric": "loss"}
    assert [e["value"] for e in events[6:9]] == ["bfloat16", "bfloat16", "fp32"]
    assert events[6]["metadata"]["observed"] is False
    assert events[-1]["metadata"] == {"status": "success"}
    # and ampcert's own reader takes it
    assert [e.key for e in mllog_reader.read(path)] == keys(events)


def test_path_and_seed_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPCERT_MLLOG", str(tmp_path / "run.mllog"))
    monkeypatch.setenv("AMPCERT_SEED", "7")
    tracker = track.start()
    tracker.stop()
    tracker.stop()  # a second stop does nothing
    assert [(e["key"], e["value"]) for e in lines(tmp_path / "run.mllog")] == [
        ("seed", 7), ("run_start", None), ("run_stop", None)]
    with pytest.raises(RuntimeError, match="stopped"):
        tracker.eval(0.9, samples=10)


def test_without_a_path_nothing_is_written_and_the_step_still_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with track.start(seed=1, global_batch_size=8) as tracker:
        assert not tracker.active and tracker.path is None
        tracker.eval(0.5, samples=8)
        tracker.disclose(linear="fp32")
        assert tracker.probe(None, lambda a, b: a + b, 2, b=3) == 5  # no model needed: nothing is measured
    assert list(tmp_path.iterdir()) == []


def test_only_rank_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    tracker = track.start(tmp_path / "run.mllog")
    tracker.eval(0.5, samples=8)
    tracker.stop()
    assert not tracker.active and not (tmp_path / "run.mllog").exists()


def test_an_exception_stops_the_run_aborted(tmp_path):
    path = tmp_path / "run.mllog"
    with pytest.raises(ZeroDivisionError):
        with track.start(path) as tracker:
            tracker.eval(0.1, samples=4)
            1 / 0  # noqa: B018
    events = lines(path)
    assert keys(events) == ["run_start", "eval_accuracy", "run_stop"]
    assert events[-1]["metadata"] == {"status": "aborted"}


def test_bad_arguments_are_refused(tmp_path):
    tracker = track.start(tmp_path / "run.mllog")
    with pytest.raises(ValueError, match="status"):
        tracker.stop("crashed")
    with pytest.raises(ValueError, match="samples"):
        tracker.eval(0.5, samples=1.5)
    with pytest.raises(ValueError, match="precision"):
        tracker.disclose(linear="int4")
    tracker.stop()


def test_probe_measures_what_the_step_computed_in(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])

    def step(dtype):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for name, dtype, expected in (("bf16", torch.bfloat16, "bfloat16"), ("fp32", None, "fp32")):
        path = tmp_path / f"{name}.mllog"
        with track.start(path) as tracker:
            loss = tracker.probe(model, step, dtype)
            assert isinstance(loss, float)
            assert tracker.disclosed["linear"]["value"] == expected
        events = {e["key"]: e for e in lines(path)}
        linear = events[mllog.LOWEST_PRECISION_LINEAR]
        assert linear["value"] == expected and linear["metadata"]["observed"] is True
        assert "mm" in linear["metadata"]["ops"]  # the backward's matmuls were seen too
        attn = events[mllog.LOWEST_PRECISION_ATTN]
        assert attn["value"] == expected and attn["metadata"]["observed"] is False  # no attention here


def test_env_reads_the_ampcert_variables(tmp_path, monkeypatch):
    cfg = track.env()
    assert (cfg.precision, cfg.amp, cfg.seed, cfg.mllog, cfg.under_ampcert, cfg.mixed) == (
        "fp32", "native", None, None, False, False)
    for name, value in {"AMPCERT_MLLOG": str(tmp_path / "r.mllog"), "AMPCERT_PRECISION": "bf16",
                        "AMPCERT_SEED": "11", "AMPCERT_AMP": "ampcert", "AMPCERT_RUN_DIR": str(tmp_path),
                        "AMPCERT_RUN_ID": "r1", "AMPCERT_DEVICE": "cpu"}.items():
        monkeypatch.setenv(name, value)
    cfg = track.env()
    assert cfg == track.Env(precision="bf16", seed=11, amp="ampcert", run_dir=tmp_path, device="cpu",
                            mllog=tmp_path / "r.mllog", run_id="r1")
    assert cfg.under_ampcert and cfg.mixed
    with pytest.raises(AttributeError):
        cfg.seed = 3  # frozen
    monkeypatch.setenv("AMPCERT_PRECISION", "int8")
    with pytest.raises(ValueError, match="AMPCERT_PRECISION"):
        track.env()
    monkeypatch.setenv("AMPCERT_PRECISION", "fp16")
    monkeypatch.setenv("AMPCERT_SEED", "one")
    with pytest.raises(ValueError, match="AMPCERT_SEED"):
        track.env()


def test_imports_need_no_torch_and_name_the_extra_that_is_missing():
    # torch, transformers and lightning made unimportable in a fresh interpreter
    code = textwrap.dedent("""
        import sys
        for name in ("torch", "transformers", "accelerate", "lightning"):
            sys.modules[name] = None
        import ampcert.integrations, ampcert.track
        t = ampcert.track.start()
        t.eval(0.5, samples=1); t.stop()
        for module, extra in (("hf", "ampcert[hf]"), ("lightning", "ampcert[lightning]")):
            try:
                __import__("ampcert.integrations." + module)
            except ImportError as exc:
                assert f"pip install '{extra}'" in str(exc), exc
            else:
                raise AssertionError(module + " imported")
        assert "torch" not in [m for m, v in sys.modules.items() if v is not None]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
