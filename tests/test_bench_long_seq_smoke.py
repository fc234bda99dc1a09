"""benchmarks/bench_long_seq.py parses its options and names its parts (in process; the runs
themselves are the benchmark's)."""

import importlib.util

import pytest

from helpers import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("_bench_long_seq",
                                                  ROOT / "benchmarks" / "bench_long_seq.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_options_and_parts():
    bench = _load()
    assert "throughput" in bench.PARTS
    args = bench.parse_args(["--parts", "throughput", "--seqs", "4096,16384", "--ranks", "2,4"])
    assert args.seq_list == [4096, 16384] and args.rank_list == [2, 4]
    smoke = bench.parse_args(["--smoke"])
    assert smoke.no_peer and smoke.seq_list == [256]
    with pytest.raises(SystemExit):
        bench.parse_args(["--parts", "nope"])
