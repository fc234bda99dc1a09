"""The 3D grid arithmetic (DeepSpeed's pipe x data x model order), its validation, and the
pipeline partitioner. The process groups themselves are exercised by the multi-rank pipe/TP
tests (tests/test_pipe.py, tests/test_tensor_parallel.py)."""

import pytest

from dslaunch.engine.parallel.pipe.module import partition_balanced
from dslaunch.engine.parallel.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
    TopologyError,
    make_topology,
)


def test_deepspeed_order_model_fastest():
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.world_size() == 8
    assert [tuple(topo.get_coord(r)) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert topo.get_coord(5).pipe == 1 and topo.get_coord(5).data == 0 and topo.get_coord(5).model == 1
    assert topo.get_rank(pipe=1, data=1, model=0) == 6
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.get_axis_comm_lists("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.filter_match(pipe=0, model=1) == [1, 3]
    assert topo.get_axis_comm_lists("expert") == []
    assert topo.get_dim("expert") == 1


def test_every_rank_in_exactly_one_group_per_axis():
    topo = PipeModelDataParallelTopology(num_pp=3, num_mp=2, num_dp=4)
    for axis in ("pipe", "data", "model"):
        flat = sorted(r for group in topo.get_axis_comm_lists(axis) for r in group)
        assert flat == list(range(24))
        for group in topo.get_axis_comm_lists(axis):
            coords = [topo.get_coord(r) for r in group]
            assert [getattr(c, axis) for c in coords] == list(range(topo.get_dim(axis)))
            others = {tuple(v for a, v in c._asdict().items() if a != axis) for c in coords}
            assert len(others) == 1


def test_two_axis_topology():
    topo = PipeDataParallelTopology(num_pp=2, num_dp=3)
    assert topo.get_axis_comm_lists("pipe") == [[0, 3], [1, 4], [2, 5]]
    assert topo.get_dim("model") == 1


def test_make_topology_factors_and_refuses():
    topo = make_topology(8, pipe=2, model=2)
    assert topo.dims == [2, 2, 2]
    assert make_topology(4, pipe=2).dims == [2, 2, 1]
    with pytest.raises(TopologyError, match="world size 6 does not factor into pipeline stages 4"
                                            " x tensor parallel 1"):
        make_topology(6, pipe=4)
    with pytest.raises(TopologyError, match="not divisible by 4"):
        make_topology(6, pipe=2, model=2)
    with pytest.raises(TopologyError, match=">= 1"):
        ProcessTopology(["pipe", "data"], [0, 2])
    with pytest.raises(TopologyError, match="outside"):
        topo.get_coord(8)


def test_partition_balanced():
    assert partition_balanced([1, 1, 1, 1], 2) == [0, 2, 4]
    assert partition_balanced([10, 1, 1, 1, 1, 10], 2) == [0, 3, 6]
    assert partition_balanced([100, 1, 1, 1], 2) == [0, 1, 4]
    assert partition_balanced([1, 2, 3], 3) == [0, 1, 2, 3]
    assert partition_balanced([5, 0, 0, 5], 2) == [0, 1, 4]
    with pytest.raises(ValueError, match="at least one layer"):
        partition_balanced([1, 1], 3)
