"""keep_last (engine/storage/retention.py): the oldest checkpoints by save order go, the
newest N stay, the one ``latest`` names is never deleted, and nothing but dslaunch checkpoints
is touched."""

import json

from dslaunch.engine.storage.retention import prune


def _ckpt(d, tag, saved_at, fmt="dslaunch-checkpoint/1"):
    (d / tag).mkdir()
    (d / tag / "metadata.json").write_text(json.dumps({"format": fmt, "saved_at": saved_at}))


def test_keeps_the_newest_by_save_order_and_never_latest(tmp_path):
    # save order is not name order: global_step10 was saved before global_step9 here
    for tag, when in [("global_step10", 1.0), ("global_step9", 2.0), ("a", 3.0), ("b", 4.0)]:
        _ckpt(tmp_path, tag, when)
    _ckpt(tmp_path, "not_ours", 0.5, fmt="something-else")
    (tmp_path / "data").mkdir()
    assert prune(str(tmp_path), 2, latest_tag="global_step10") == ["global_step9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "data", "global_step10",
                                                         "not_ours"]
    assert prune(str(tmp_path), 0, latest_tag=None) == []  # 0: keep all
    assert prune(str(tmp_path), 1, latest_tag="b") == ["global_step10", "a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "data", "not_ours"]
