"""The files through which an agent and its ranks talk during an in-process recovery
(``dslaunch run --recover in-process``): shared by the agent (``launcher/agent.py``,
``launcher/agent_recovery.py``) and the engine (``engine/recovery/``), which may not
import each other. No torch here.

- the **instruction** (``FILE_ENV`` names it, one per rank slot of the node): the launcher's
  ``recover`` word for a surviving rank, written whole (rename) by the agent;
- its **answer** (``ack_path``): what the rank did: ``recovered``, ``joined`` (a replacement) or
  ``refused`` (with why), and the seconds each phase took; before it, a survivor writes
  ``recovering`` as its main thread takes the word (the launcher gives up on one that does not
  within the hang timeout: ``launcher/inprocess.py``);
- a replacement rank gets its instruction in ``JOIN_ENV`` instead;
- a **standby** (a process the agent starts ahead, which runs the script up to dslaunch's first
  call and waits there: ``STANDBY_ENV`` names the file it waits for) is promoted to a lost rank by
  that file: ``{"env": {...}}``, the rank's environment (``JOIN_ENV`` included).
"""

from __future__ import annotations

import json
import os

FILE_ENV = "DSLAUNCH_RECOVER_FILE"
JOIN_ENV = "DSLAUNCH_RECOVER_JOIN"
STANDBY_ENV = "DSLAUNCH_STANDBY_FILE"  # set in a standby process only: its promotion file
# the user's switch: "0" starts no standby (a replacement then starts after the fault)
STANDBY_SWITCH_ENV = "DSLAUNCH_RECOVER_STANDBY"
REFUSED_EXIT = 76  # a rank that cannot recover in process exits with this: the job restarts


def standbys_off(plan_env: dict) -> bool:
    """The user's switch (``STANDBY_SWITCH_ENV``), in the launcher's environment or the job's
    (``plan.env`` wins): no standby process on any host, the spares' included."""
    return {**os.environ, **plan_env}.get(STANDBY_SWITCH_ENV) == "0"


def ack_path(instruction_file: str) -> str:
    return instruction_file + ".ack"


def write_json(path: str, data: dict) -> None:
    """Whole or not at all: the reader polls the file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
