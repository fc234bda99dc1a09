"""DeepSpeed-compatible resource selection (-i/-e/--num-nodes/--nproc-per-node)."""

import pytest

from dslaunch.launcher.resources import ResourceError, select_resources

HOSTS = {"worker-0": 4, "worker-1": 4, "worker-2": 2}


def test_all_by_default_in_hostfile_order():
    assert select_resources(HOSTS) == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}
    assert list(select_resources({"b": 1, "a": 1})) == ["b", "a"]


def test_include_host_and_slots_keeps_plan_order():
    got = select_resources(HOSTS, include="worker-2@worker-0:2,0,2")
    assert list(got.items()) == [("worker-0", [0, 2]), ("worker-2", [0, 1])]


def test_include_repeated_host_merges_and_bare_name_means_all():
    assert select_resources(HOSTS, include="worker-1:3@worker-1:1") == {"worker-1": [1, 3]}
    assert select_resources(HOSTS, include="worker-1:3@worker-1") == {"worker-1": [0, 1, 2, 3]}
    assert select_resources(HOSTS, include="worker-1@worker-1:3") == {"worker-1": [0, 1, 2, 3]}


def test_exclude_slots_and_whole_hosts():
    got = select_resources(HOSTS, exclude="worker-1:0,3@worker-2")
    assert got == {"worker-0": [0, 1, 2, 3], "worker-1": [1, 2]}
    # excluding every slot of a host drops the host
    assert "worker-2" not in select_resources(HOSTS, exclude="worker-2:0,1")


def test_exclude_everything():
    with pytest.raises(ResourceError, match="leaves no slot"):
        select_resources({"a": 2}, exclude="a:0,1")


def test_num_nodes_and_nproc():
    assert select_resources(HOSTS, num_nodes=2) == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}
    assert select_resources(HOSTS, nproc_per_node=2) == {"worker-0": [0, 1], "worker-1": [0, 1], "worker-2": [0, 1]}
    assert select_resources(HOSTS, num_nodes=1, nproc_per_node=3) == {"worker-0": [0, 1, 2]}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(include="worker-0", exclude="worker-1"), "--include and --exclude cannot be used together"),
    (dict(include="worker-0", num_nodes=1), "--num-nodes cannot be used together with --include"),
    (dict(exclude="worker-0", nproc_per_node=1), "--nproc-per-node cannot be used together with --exclude"),
    (dict(include="worker-9"), "unknown host 'worker-9'"),
    (dict(exclude="nope:1"), "unknown host 'nope'"),
    (dict(include="worker-2:2"), "host 'worker-2' has no slot 2 (it has slots 0-1)"),
    (dict(include="worker-2:-1"), "has no slot -1"),
    (dict(include="worker-0:a"), "slot 'a' of host 'worker-0' is not an integer"),
    (dict(include="worker-0:"), "slot '' of host 'worker-0' is not an integer"),
    (dict(include="worker-0@"), "empty NODE_SPEC"),
    (dict(num_nodes=4), "--num-nodes 4 but only 3 host(s)"),
    (dict(num_nodes=0), "--num-nodes must be a positive integer, got 0"),
    (dict(nproc_per_node=3), "--nproc-per-node 3 but host 'worker-2' has only 2 slot(s)"),
    (dict(nproc_per_node=-1), "must be a positive integer"),
])
def test_errors(kwargs, needle):
    with pytest.raises(ResourceError) as ei:
        select_resources(HOSTS, **kwargs)
    assert needle in str(ei.value)


def test_no_hosts():
    with pytest.raises(ResourceError):
        select_resources({})
