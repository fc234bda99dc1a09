"""The W&B and Comet monitors, run for real and offline: a one-rank engine trains three steps
with the section enabled, ``engine.destroy()`` ends the run, and the test reads back what the
library wrote (W&B's run file, Comet's offline archive). Missing packages: a clear error."""

import json
import struct
import sys
import zipfile
from pathlib import Path

import pytest
from test_engine_monitor import _engine, _train


def _wandb_history(run_file: Path) -> list:
    """The history rows (``{key: value}``) of a W&B run file: a LevelDB-style log of protobuf
    ``Record``s (7-byte file header; in 32 KiB blocks, each chunk: crc32, length, type) read with
    wandb's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, rows, pos, pending = run_file.read_bytes(), [], 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4) and pending:  # a FULL chunk, or the LAST of a split record
            rec = pb.Record()
            rec.ParseFromString(pending)
            pending = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in rec.history.item})  # keys with "/" come nested
    return rows


def test_wandb_offline_run_holds_every_step(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    e = _engine(wandb={"enabled": True, "project": "dsl-test", "group": "g1"})
    losses = _train(e, 3)
    e.destroy()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows = [r for r in _wandb_history(run_file) if "Train/Samples/train_loss" in r]
    assert [r["_step"] for r in rows] == [2, 4, 6]  # global samples, as DeepSpeed logs them
    assert [r["Train/Samples/train_loss"] for r in rows] == pytest.approx(losses)
    assert [r["Train/Samples/lr"] for r in rows] == pytest.approx([0.2, 0.3, 0.4])


def test_comet_offline_experiment_holds_the_logged_samples(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    e = _engine(comet={"enabled": True, "online": False, "project": "dsl-test",
                       "experiment_name": "run-a", "samples_log_interval": 4})
    losses = _train(e, 3)
    e.destroy()
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").splitlines()]
        experiment = json.loads(z.read("experiment.json"))
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    loss = [(m["step"], m["metricValue"]) for m in metrics
            if m["metricName"] == "Train/Samples/train_loss"]
    # samples 2, 4, 6: logged at 2 (first), skipped at 4 (2 < 4 since), logged at 6
    assert loss == [(2, pytest.approx(losses[0])), (6, pytest.approx(losses[2]))]
    assert experiment["project_name"] == "dsl-test"
    assert any(m["type"] == "log_other" and m["payload"].get("value") == "run-a"
               for m in messages)


@pytest.mark.parametrize("key, package", [("wandb", "wandb"), ("comet", "comet_ml")])
def test_missing_tracker_package_is_a_clear_error(key, package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # what an environment without it sees
    with pytest.raises(RuntimeError, match=rf"{key}.enabled: the {package} package is not "
                                           rf"installed; `pip install {package}`"):
        _engine(**{key: {"enabled": True}})
