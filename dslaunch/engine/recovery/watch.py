"""The survivor's watch: a thread that waits for the launcher's instruction (the file the agent
writes, ``DSLAUNCH_RECOVER_FILE``) and then shuts this rank's connections to the job's hosts, so
that a collective blocked on the lost peer raises at once (gloo has no abort of its own)."""

from __future__ import annotations

import os
import socket
import threading
import time

from dslaunch.engine.comm.membership import join_word
from dslaunch.recover_files import FILE_ENV, ack_path, read_json, write_json

WAIT_ENV = "DSLAUNCH_RECOVER_WAIT"
WAIT_DEFAULT = 30.0  # how long a rank whose collective failed waits for the launcher's word
POLL = 0.05


def host_addresses(hosts: list) -> set:
    out = set()
    for host in hosts:
        try:
            out.update(info[4][0] for info in socket.getaddrinfo(host, None))
        except OSError:
            continue
    return out


def abort_connections(hosts: list, store_port: int) -> int:
    """Shut down this process's TCP connections to the job's ``hosts`` (loopback too), except the
    store's (``store_port``, either end): a gloo collective waiting on them raises. Returns how
    many were shut. Listening sockets are left alone (gloo aborts the process if its listener
    fails)."""
    peers = host_addresses(hosts)
    shut = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM:
                    continue
                peer, local = sock.getpeername(), sock.getsockname()
            except OSError:  # not connected (a listener)
                continue
            if store_port in (peer[1], local[1]):
                continue
            if peer[0] in peers or peer[0].startswith("127.") or peer[0] == "::1":
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
                except OSError:
                    pass
    return shut


class Watch:
    """The survivor's side: a thread that waits for the launcher's instruction and aborts."""

    def __init__(self, path: str, epoch: int = 0):
        self.path = path
        self.epoch = epoch  # instructions up to this one are done (a replacement starts at its own)
        self.word: dict | None = None
        self.arrived = threading.Event()
        self.abandoning = 0  # step() calls of the interrupted step still to skip
        self.script_skip = False  # its own collectives raise StepAbandoned until its next forward
        self.in_engine = 0  # inside an engine call: its collectives are not the script's
        self.joined = False  # a replacement that took its state from its peers
        self.aborted_at: float | None = None
        threading.Thread(target=self._run, daemon=True, name="dslaunch-recover").start()

    @staticmethod
    def env_present() -> bool:
        """Whether the launcher gave this rank a watch file (``--recover in-process``)."""
        return bool(os.environ.get(FILE_ENV))

    @classmethod
    def from_env(cls) -> "Watch | None":
        path = os.environ.get(FILE_ENV)
        if not path:
            return None
        word = join_word()
        return cls(path, word["epoch"] if word else 0)

    def _run(self) -> None:
        seen = None  # the file's (inode, mtime, size) last read: an unchanged file is not parsed
        # again (the agent writes each word whole under a new inode: recover_files.write_json)
        while True:
            time.sleep(POLL)
            if self.arrived.is_set():
                continue
            try:
                st = os.stat(self.path)
            except OSError:
                continue
            if (st.st_ino, st.st_mtime_ns, st.st_size) == seen:
                continue
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            word = read_json(self.path)
            if word is None or word.get("epoch", 0) <= self.epoch:
                continue
            self.word = word
            self.aborted_at = time.time()
            abort_connections(word.get("hosts", []), int(os.environ.get("MASTER_PORT", 0)))
            self.arrived.set()

    def wait_for_word(self) -> bool:
        return self.arrived.wait(float(os.environ.get(WAIT_ENV, WAIT_DEFAULT)))

    def ack(self, **fields) -> None:
        write_json(ack_path(self.path), {"epoch": self.word["epoch"], **fields})

    def done(self) -> None:
        self.epoch = self.word["epoch"]
        self.word = None
        self.arrived.clear()
