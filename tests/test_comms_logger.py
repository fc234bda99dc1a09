"""The communication logger (``comms_logger`` config section, ``dslaunch.comm.configure`` /
``log_summary``): one 2-rank ``dslaunch run`` of tests/scripts/comms_logger_rank.py. Every
collective is recorded under its booked name, per message size, with counts equal to the calls
issued and bytes equal to ``engine.comm_stats()``'s; bandwidths follow DeepSpeed's formulas;
``prof_ops`` filters, ``enabled=False`` records nothing. The formulas are also checked alone."""

import math

import pytest

from dslaunch.engine.observe.comms_logger import CommsLogger, bandwidths, convert_size, trim_mean

CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False}}

# busbw / algbw per op on n ranks (DeepSpeed's formulas)
BUS_OVER_ALG = {"all_reduce": lambda n: (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0}


@pytest.fixture(scope="module")
def ranks(job_cache):
    job = job_cache.run("comms_logger", "comms_logger_rank.py", "--out", "{dir}", config=CONFIG)
    return job.results()


def _totals(logged):
    """{op: (calls, bytes)} summed over message sizes."""
    return {op: (sum(r["count"] for r in sizes.values()),
                 sum(r["count"] * r["msg_size_bytes"] for r in sizes.values()))
            for op, sizes in logged.items()}


def _delta(after, before):
    out = {}
    for op, rec in after.items():
        prev = before.get(op, {"calls": 0, "bytes": 0})
        if rec["calls"] != prev["calls"]:
            out[op] = (rec["calls"] - prev["calls"], rec["bytes"] - prev["bytes"])
    return out


def test_counts_and_bytes_match_what_was_issued_and_booked(ranks):
    for r in ranks:
        assert r["enabled_by_config"] is True
        # the engine's own collectives (init broadcasts, gradient all-reduce): all recorded
        assert _totals(r["engine_logged"]) == {op: (v["calls"], v["bytes"])
                                              for op, v in r["engine_booked"].items()}
        # the script's: exactly the calls issued, per op and message size
        expected = {}
        for op, size, n in r["issued"]:
            expected.setdefault(op, {})[str(size)] = n
        assert {op: {s: rec["count"] for s, rec in sizes.items()}
                for op, sizes in r["logged"].items()} == expected
        # and their bytes are comm_stats' bytes over the same calls
        assert _totals(r["logged"]) == _delta(r["booked"], r["engine_booked"])


def test_bandwidths_follow_the_formulas(ranks):
    n = ranks[0]["world"]
    for op, sizes in ranks[0]["logged"].items():
        for rec in sizes.values():
            assert rec["avg_latency_ms"] > 0 and rec["total_latency_ms"] >= rec["avg_latency_ms"]
            assert math.isclose(rec["busbw_avg_gbps"], rec["tput_avg_gbps"] * BUS_OVER_ALG[op](n),
                                rel_tol=1e-9)
            if rec["count"] == 1:  # one call: algbw from its own latency
                scale = {"all_reduce": 2, "all_gather": n}.get(op, 1)
                alg = scale * rec["msg_size_bytes"] / rec["avg_latency_ms"] * 8 / 1e6
                assert math.isclose(rec["tput_avg_gbps"], alg, rel_tol=1e-9)


def test_summary_printed_on_rank0_only_and_switches(ranks):
    r0, r1 = ranks
    assert "busbw_avg (Gbps)" in r0["printed"] and "reduce_scatter" in r0["printed"]
    assert "collectives booked on this rank" in r0["printed"]
    assert r1["printed"] == ""
    for r in ranks:
        assert r["only_broadcast"] == ["broadcast"]  # prof_all off, prof_ops=["broadcast"]
        assert r["disabled_count"] == 0  # enabled=False: nothing recorded


def test_straggler_breakdown_splits_each_latency(ranks):
    """``log_summary(show_straggler=True)``: per op and size, the smallest latency any rank saw
    for each call plus this rank's lateness is this rank's latency (DeepSpeed's breakdown)."""
    for r in ranks:
        assert set(r["stragglers"]) == set(r["logged"])
        for op, sizes in r["stragglers"].items():
            for size, rec in sizes.items():
                mine = r["logged"][op][size]
                assert rec["count"] == mine["count"]
                assert rec["total_straggler_ms"] >= 0 and rec["total_comm_lat_ms"] >= 0
                assert rec["total_comm_lat_ms"] + rec["total_straggler_ms"] == \
                    pytest.approx(mine["total_latency_ms"], rel=1e-9, abs=1e-9)
    # the minimum is common: both ranks agree on it
    assert ranks[0]["stragglers"]["broadcast"]["20"]["total_comm_lat_ms"] == pytest.approx(
        ranks[1]["stragglers"]["broadcast"]["20"]["total_comm_lat_ms"])
    assert "Breakdown with straggler effect" in ranks[0]["straggler_printed"]
    assert ranks[1]["straggler_printed"] == ""  # printed on rank 0 only


def test_formulas_and_record_layout():
    # 1 MB all_reduce in 1 ms on 4 ranks: algbw 2 x 8 Gbit/s, busbw 8 x 2 x 3/4
    assert bandwidths("all_reduce", 10**6, 1.0, 4) == pytest.approx((16.0, 12.0))
    assert bandwidths("all_gather", 10**6, 1.0, 4) == pytest.approx((32.0, 24.0))
    assert bandwidths("reduce_scatter", 10**6, 1.0, 4) == pytest.approx((8.0, 6.0))
    assert bandwidths("all_to_all", 10**6, 1.0, 4) == pytest.approx((8.0, 6.0))
    assert bandwidths("broadcast", 10**6, 1.0, 4) == pytest.approx((8.0, 8.0))
    assert bandwidths("barrier", 0, 1.0, 4) == (0.0, 0.0)
    assert convert_size(1536) == "1.5 KB" and convert_size(0) == "0B"
    assert trim_mean([100.0] + [1.0] * 8 + [0.0]) == 1.0
    log = CommsLogger()
    log.configure({"enabled": True, "prof_all": False, "prof_ops": ["all_reduce"], "debug": True})
    log.record("all_reduce", 64, 0.002, 2)
    log.record("broadcast", 64, 0.002, 2)
    (name,) = log.get_operation_names()
    assert name.startswith("all_reduce | [Caller Func: ")  # debug: who called
    assert log.comms_dict[name][64][0] == 1 and log.get_total_operations() == 1
