"""Where the launcher puts a new group's store after a fault (launcher/inprocess.py): never the
job's port + epoch once the store host's agent has said which port is free there (a clean-clone
run once found port + 1 taken by one of gloo's own listeners, and the recovery failed)."""

import socket
from types import SimpleNamespace

from dslaunch.launcher.inprocess import InProcessRecovery


def _recovery(hosts):
    plan = SimpleNamespace(nodes=[{"host": h, "node_rank": i} for i, h in enumerate(hosts)],
                           master_port=29500, recover="in-process")
    return InProcessRecovery(SimpleNamespace(plan=plan))


def test_a_remote_store_takes_the_port_its_agent_last_found_free():
    ipr = _recovery(["host1", "host2"])
    assert ipr._store_port(1, 1) == 29501  # no heartbeat yet: the job's port + epoch
    ipr.on_heartbeat({"event": "heartbeat", "node_rank": 0, "free_port": 40000})
    ipr.on_heartbeat({"event": "heartbeat", "node_rank": 1, "free_port": 41234})
    ipr.on_heartbeat({"event": "heartbeat", "node_rank": 1})  # a beat without one keeps the last
    assert (ipr._store_port(2, 0), ipr._store_port(2, 1)) == (40000, 41234)


def test_a_store_on_this_host_takes_a_port_free_now():
    ipr = _recovery(["localhost", "127.0.0.1"])
    with socket.socket() as taken:  # a heartbeat's port, taken since: not used on this host
        taken.bind(("", 0))
        taken.listen()
        ipr.on_heartbeat({"event": "heartbeat", "node_rank": 0,
                          "free_port": taken.getsockname()[1]})
        port = ipr._store_port(1, 0)
        assert port != taken.getsockname()[1]
        with socket.socket() as s:  # free indeed
            s.bind(("", port))
