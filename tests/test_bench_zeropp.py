"""benchmarks/bench_zeropp.py's pure parts, with no namespaces: the link counters and the bytes of
a window of steps, the configuration matrix, the compact --zero-extra form that survives a remote
shell, and the summary (ratios, targets met / not met / not measured) and its JSON shape."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import ROOT

sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "peer_scripts")]

import bench_zeropp as bz  # noqa: E402
import netcounters  # noqa: E402
from zero_config import format_zero_extra, parse_zero_extra, train_config  # noqa: E402

PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier
    lo: 4242       10    0    0    0     0          0         0     4242      10    0    0    0     0       0          0
  eth0:123456789  900    0    0    0     0          0         0 987654321    800    0    0    0     0       0          0
"""


def test_counters_parse_and_read_this_namespace():
    c = netcounters.parse_proc_net_dev(PROC_NET_DEV)
    assert c == {"lo": {"rx_bytes": 4242, "tx_bytes": 4242},
                 "eth0": {"rx_bytes": 123456789, "tx_bytes": 987654321}}
    rx, tx = netcounters.read_iface("lo")  # the real file of this process's namespace
    assert rx >= 0 and tx >= 0
    with pytest.raises(KeyError, match="no-such-if"):
        netcounters.read_iface("no-such-if")


def _rank(rank, host, tx, rx=None):
    return {"rank": rank, "netdev": {"host": host, "iface": "eth0", "tx": tx, "rx": rx or [0] * len(tx)}}


def test_window_bytes_one_rank_per_host_after_warmup():
    # 1 warm-up + 2 timed steps: samples before step 1, after steps 1, 2, 3
    ranks = [_rank(1, "host1", [0, 0, 0, 0]),            # same host, higher rank: ignored
             _rank(0, "host1", [0, 1000, 1500, 2100], rx=[0, 10, 20, 40]),
             _rank(2, "host2", [5, 5005, 5505, 6005]),
             _rank(3, "host2", [9, 9, 9, 9])]
    w = netcounters.window_bytes(ranks, warmup=1, steps=2)
    assert w["hosts"] == {"host1": {"tx_bytes": 1100, "rx_bytes": 30}, "host2": {"tx_bytes": 1000, "rx_bytes": 0}}
    assert w["tx_bytes"] == 2100 and w["tx_bytes_per_step"] == 1050.0
    with pytest.raises(ValueError, match="counter samples"):
        netcounters.window_bytes(ranks, warmup=2, steps=2)
    assert netcounters.window_bytes([{"rank": 0}], 0, 1)["tx_bytes_per_step"] is None


def test_configuration_matrix_and_zero_extra():
    cs = {c["name"]: c for c in bz.configurations(list(bz.OURS + bz.PEER), ranks_per_host=2)}
    assert list(cs) == ["zero3", "hpz", "qwz+hpz", "qwz+qgz+hpz", "mics", "deepspeed/zero3", "deepspeed/hpz"]
    assert cs["zero3"]["zero"] == {} and cs["deepspeed/zero3"]["runtime"] == "deepspeed"
    assert cs["qwz+qgz+hpz"]["zero"] == {"zero_quantized_weights": True, "zero_quantized_gradients": True,
                                         "zero_hpz_partition_size": 2}
    assert cs["deepspeed/hpz"]["zero"] == cs["hpz"]["zero"] == {"zero_hpz_partition_size": 2}
    assert cs["mics"]["zero"]["mics_shard_size"] == 2
    base = bz.configurations(["zero3", "hpz"], 2, base={"stage3_max_reuse_distance": 0})
    assert base[0]["zero"] == {"stage3_max_reuse_distance": 0}
    assert base[1]["zero"] == {"stage3_max_reuse_distance": 0, "zero_hpz_partition_size": 2}
    assert bz.configurations(["hpz"], 2, base={"zero_hpz_partition_size": 9})[0]["zero"] == \
        {"zero_hpz_partition_size": 2}  # a configuration's own keys win over the base
    with pytest.raises(SystemExit, match="zero4"):
        bz.configurations(["zero4"], 2)
    for c in cs.values():  # the compact form carries every configuration's keys unchanged
        text = format_zero_extra(c["zero"])
        assert not set(text) & set(" \"'{}"), text
        assert parse_zero_extra(text) == c["zero"]
        assert train_config(3, extra=text)["zero_optimization"] == {"stage": 3, **c["zero"]}
    assert parse_zero_extra('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(ValueError, match="key=value"):
        parse_zero_extra("zero_hpz_partition_size")
    assert bz.refusal(cs["zero3"], world=4, micro_batch=4) is None  # plain ZeRO-3 is never refused
    assert bz.refusal(cs["deepspeed/hpz"], world=4, micro_batch=4) is None  # the peer is not checked


def _ok(name, tokens, xbytes, losses=(2.0, 1.5)):
    return {"config": name, "status": "ok", "tokens_per_s": tokens, "inter_host_bytes_per_step": xbytes,
            "whole_job_link_bytes": {"sent_bytes": xbytes * 10}, "losses": list(losses)}


def test_summary_ratios_targets_and_json_shape():
    configs = bz.configurations(["zero3", "hpz", "qwz+qgz+hpz", "mics", "deepspeed/zero3", "deepspeed/hpz"], 2)
    runs = [_ok("zero3", 100.0, 4e6), _ok("zero3", 120.0, 4e6), _ok("qwz+qgz+hpz", 160.0, 1e6, (2.0, 1.6)),
            {"config": "hpz", "status": "refused", "message": "zero_hpz_partition_size: not supported yet"},
            {"config": "mics", "status": "failed", "message": "exit 1, 0/4 rank results", "log_tail": "..."},
            _ok("deepspeed/zero3", 100.0, 5e6), _ok("deepspeed/hpz", 90.0, 3e6)]
    rows = {r["name"]: r for r in bz.summarise(configs, runs)}
    z3 = rows["zero3"]
    assert z3["tokens_per_s"] == 110.0 and z3["runs"] == 2 and "vs_zero3" not in z3["ratios"]
    assert z3["ratios"]["vs_deepspeed/zero3"]["tokens_per_s"] == 1.1
    assert z3["ratios"]["vs_deepspeed/zero3"]["inter_host_bytes_reduction"] == 1.25
    q = rows["qwz+qgz+hpz"]["ratios"]["vs_zero3"]
    assert q["inter_host_bytes_reduction"] == 4.0 and q["tokens_per_s"] == round(160 / 110, 4)
    assert q["loss_max_abs_diff"] == pytest.approx(0.1)
    assert rows["hpz"]["status"] == "refused" and "not supported" in rows["hpz"]["message"]
    assert rows["mics"]["status"] == "failed"
    assert rows["hpz"]["zero_optimization"] == {"stage": 3, "zero_hpz_partition_size": 2}
    tg = {t["target"]: t for t in bz.targets(list(rows.values()))}
    assert len(tg) == len(bz.TARGETS)
    met = {t["configuration"] + ">" + t["measure"]: t["met"] for t in tg.values()}
    assert met == {"qwz+qgz+hpz>inter_host_bytes_reduction": True, "qwz+qgz+hpz>tokens_per_s": False,
                   "zero3>tokens_per_s": True, "hpz>tokens_per_s": None}
    unmeasured = next(t for t in tg.values() if t["met"] is None)
    assert unmeasured["value"] is None and "hpz: refused" in unmeasured["why"]
    json.dumps({"summary": list(rows.values()), "targets": list(tg.values())})  # all JSON-serialisable


def test_scrub_paths_longest_first():
    r = {"command": "/v/bin/python /r/benchmarks/x.py --out /t/run", "runs": [{"log_tail": "in /r/a \"q\""}]}
    out = bz.scrub_paths(r, {"/r/": "", "/v/bin": "<venv>/bin", "/t": "<tmp>", None: "<peer-venv>"})
    assert out == {"command": "<venv>/bin/python benchmarks/x.py --out <tmp>/run", "runs": [{"log_tail": "in a \"q\""}]}
