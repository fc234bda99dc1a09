"""engine/comm/host_groups.py without processes: the host numbering, DSLAUNCH_FAKE_HOSTS and the
topology's groups (the groups themselves run in tests/test_zero_hier.py and on the namespace
hosts, tests/multihost/test_zero_hier_hosts.py)."""

import pytest

from dslaunch.engine.comm.host_groups import HostTopology, blocks, fake_hosts, hosts_from_names


def test_hosts_numbered_by_lowest_rank_and_local_index():
    host_of = hosts_from_names(["b", "b", "a", "a", "b"])
    assert host_of == (0, 0, 1, 1, 0)
    topo = HostTopology(host_of, rank=4)
    assert topo.num_hosts == 2 and topo.ranks_of_host(0) == [0, 1, 4]
    assert topo.local_index == 2 and topo.link([0, 1, 4]) == "intra_host"
    assert topo.link([1, 2]) == "inter_host"
    with pytest.raises(ValueError, match="different numbers of ranks"):
        topo.ranks_per_host()


def test_fake_hosts_split_the_world_in_consecutive_blocks():
    assert fake_hosts(4, {}) is None
    assert fake_hosts(4, {"DSLAUNCH_FAKE_HOSTS": "2"}) == (0, 0, 1, 1)
    assert HostTopology(fake_hosts(6, {"DSLAUNCH_FAKE_HOSTS": "3"}), 3).ranks_per_host() == 2
    for bad in ("3", "0", "two"):
        with pytest.raises(ValueError, match="DSLAUNCH_FAKE_HOSTS"):
            fake_hosts(4, {"DSLAUNCH_FAKE_HOSTS": bad})
    assert blocks(4, 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="does not divide"):
        blocks(4, 3)
