"""The agent <-> launcher protocol: text lines over the agent's stdout and stdin.

Agent stdout carries rank output lines (already prefixed for display) and event lines
``@@dslaunch-event {json}``. Agent stdin carries commands, one per line:

- ``stop failure``   a rank failed somewhere: dump every rank's Python stacks (SIGUSR1), then
                     SIGTERM, grace period, SIGKILL;
- ``stop``           stop without the dump (Ctrl-C, SIGTERM to the launcher);
- ``kill``           SIGKILL every rank now (second Ctrl-C);
- ``dump stacks R..`` send a ``stacks`` event with the Python stacks (and native ones when py-spy
                     is installed) of this node's ranks among R.. (all of them without R), which
                     go on running (the hang watchdog's report);
- ``recover {json}``  in-process recovery: the running ranks get the word in their instruction
                     files, the ranks it lists under ``replace`` on this node start again
                     (``recover_ack`` events carry the ranks' answers);
- ``kill ranks R..``  SIGKILL these ranks of this node (a hung rank, before recovering);
- EOF                the launcher or the connection is gone: same as ``stop``.

Plain text on purpose: it crosses ssh, pdsh and srun unchanged, and a human can read it.

Every line an agent writes is at most ``MAX_LINE`` bytes on the wire: srun (and mpirun) carry all
the agents' output on one stream, and slurmstepd forwards a line whole only while it fits its
1024-byte message; a longer one is cut, and another node's line can land between the pieces (an
exit event was lost that way). A longer line goes out as part lines (``frame``), which the
launcher puts back together per key before it reads the line (``Unframer``).
"""

from __future__ import annotations

import collections
import json
import secrets
import signal

EVENT_PREFIX = "@@dslaunch-event "
EVENT_PREFIX_B = EVENT_PREFIX.encode()

# Event names (the "event" field).
STARTED = "started"  # node_rank, host, pids {rank: pid}, gpus (CUDA_VISIBLE_DEVICES or null)
# ... and progress: the rank's last progress record (or null), what the live job view ends with
EXIT = "exit"  # rank, local_rank, node_rank, host, returncode, signal, time, stopped, error, output_tail
# progress {rank: progress_record.read()}; idle {rank: seconds since its record last changed,
# or, before it wrote one, since its CPU time last advanced}, every running rank, agent's clock;
# rss {rank: resident bytes} (the live job view's memory column; absent from older agents)
HEARTBEAT = "heartbeat"  # node_rank, host, time, progress, idle, rss[, free_port: in-process]
# stacks {rank: {"python": text}}, then (py-spy installed) a second one {rank: {"native": text}}
STACKS = "stacks"  # node_rank, host, stacks
RECOVER_ACK = "recover_ack"  # node_rank, host, rank, epoch, status, why | step, seconds
DONE = "done"  # node_rank, host, returncodes {rank: rc}
ERROR = "error"  # node_rank, host, message: the agent could not start its ranks

# Commands (agent stdin).
CMD_STOP = "stop"
CMD_STOP_FAILURE = "stop failure"
CMD_KILL = "kill"
CMD_DUMP_STACKS = "dump stacks"
CMD_RECOVER = "recover"  # recover {json}: in-process recovery (agent_recovery.py, engine/recovery/)
CMD_KILL_RANKS = "kill ranks"  # kill ranks R..: SIGKILL these ranks (a hung one, before recovering)
CMD_PING = "ping"  # the controller is there (fencing: an agent that stops hearing it stops)
CMD_ADOPT = "adopt"  # adopt {json}: a warm spare agent becomes a lost host's node (agent_recovery.py)


def format_event(event: str, **fields) -> bytes:
    """One event line (bytes, newline-terminated); JSON keeps it on one line whatever the values."""
    fields["event"] = event
    return EVENT_PREFIX_B + json.dumps(fields, separators=(",", ":")).encode() + b"\n"


MAX_LINE = 1000  # bytes with the newline: under slurmstepd's 1024-byte message
PART_PREFIX = b"@@dslaunch-part "
_PART_HEAD = 40  # room for the prefix, key and "i/n " within MAX_LINE
MAX_PENDING = 256  # part-lines put together at once; beyond, the oldest (its agent died) is dropped


def frame(line: bytes) -> list:
    """``line`` (newline-terminated) as the lines that go on the wire: itself when it fits in
    ``MAX_LINE``, else part lines ``@@dslaunch-part KEY I/N <bytes>``, KEY random so that the
    parts of lines from several agents on one stream never mix."""
    if len(line) <= MAX_LINE:
        return [line]
    body = line[:-1] if line.endswith(b"\n") else line
    size = MAX_LINE - _PART_HEAD
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    key = secrets.token_hex(6).encode()
    n = str(len(chunks)).encode()
    return [PART_PREFIX + key + b" " + str(i).encode() + b"/" + n + b" " + c + b"\n"
            for i, c in enumerate(chunks, 1)]


class Unframer:
    """The lines of one stream as the agents wrote them: ``feed(raw)`` gives back a whole line, or
    None while a framed line still waits for parts (they come in order per key)."""

    def __init__(self) -> None:
        self.pending: collections.OrderedDict = collections.OrderedDict()  # key -> [chunks]

    def feed(self, raw: bytes) -> bytes | None:
        if not raw.startswith(PART_PREFIX):
            return raw
        head, _, rest = raw[len(PART_PREFIX):].partition(b" ")
        count, _, chunk = rest.partition(b" ")
        i, _, n = count.partition(b"/")
        if not (i.isdigit() and n.isdigit()):
            return raw  # not ours after all: show it as it is
        chunks = self.pending.setdefault(head, [])
        chunks.append(chunk[:-1] if chunk.endswith(b"\n") else chunk)
        if int(i) < int(n):
            while len(self.pending) > MAX_PENDING:
                self.pending.popitem(last=False)
            return None
        del self.pending[head]
        return b"".join(chunks) + b"\n"


def parse_event(line: str) -> dict | None:
    """The event in ``line``, or None if it is not an event line (a malformed one is not an event)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        data = json.loads(line[len(EVENT_PREFIX):])
    except ValueError:
        return None
    return data if isinstance(data, dict) and "event" in data else None


def signal_name(returncode: int | None) -> str | None:
    """'SIGKILL' for a Popen returncode of -9; None when the process exited normally."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
