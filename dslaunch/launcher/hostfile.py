"""MPI-style hostfiles: ``HOST slots=N [spare]`` per line -> ordered ``{host: slots}``.

``spare`` after the slot count marks a host the first plan leaves out: an elastic job
(``dslaunch run --max-restarts``) takes it in when a planned host is lost, so the world size
can stay the same. Callers that want to know which hosts are spares pass a set to fill.

Blank lines and ``#`` comments (whole-line or trailing) are allowed. Every error names the file and
the line (``FILE:LINE: ...``) so a user can fix it without guessing. Host names are checked against
a conservative character set: a name is later handed to ssh/pdsh/mpirun/srun as one argv word, and
a name starting with ``-`` would be read as an option by those tools.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_HOSTFILE = Path("/job/hostfile")  # DeepSpeed's default location

# letters, digits, '.', '-', '_' ; must start with a letter or digit (never '-').
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_SLOTS_RE = re.compile(r"slots\s*=\s*(\S*)")


class HostfileError(ValueError):
    """A hostfile that cannot be used; the message names ``file:line``."""


def default_hostfile() -> Path | None:
    """``/job/hostfile`` when it exists (DeepSpeed's default), else None (a local run)."""
    return DEFAULT_HOSTFILE if DEFAULT_HOSTFILE.is_file() else None


def check_host_name(name: str) -> str | None:
    """Return why ``name`` is not a usable host name, or None when it is fine."""
    if not _HOST_RE.match(name):
        return (f"invalid host name {name!r} (letters, digits, '.', '-', '_'; "
                "must start with a letter or digit)")
    return None


SPARE = "spare"


def parse_hostfile_text(text: str, path: str = "<hostfile>",
                        spares: set | None = None) -> dict[str, int]:
    hosts: dict[str, int] = {}
    first_line: dict[str, int] = {}
    found_spares: set = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        parts = line.split(None, 1)
        host = parts[0]
        why = check_host_name(host)
        if why:
            raise HostfileError(f"{where}: {why}")
        rest = parts[1].strip() if len(parts) > 1 else ""
        if not rest:
            raise HostfileError(f"{where}: host {host!r} has no slot count (expected '{host} slots=N')")
        m = _SLOTS_RE.match(rest)
        if not m:
            raise HostfileError(f"{where}: expected 'slots=N' after host {host!r}, got {rest!r}")
        value = m.group(1)
        if not value:
            raise HostfileError(f"{where}: host {host!r} has an empty slot count")
        try:
            slots = int(value, 10)
        except ValueError:
            raise HostfileError(f"{where}: slot count {value!r} for host {host!r} is not an integer") from None
        if slots <= 0:
            raise HostfileError(f"{where}: slot count for host {host!r} must be positive, got {slots}")
        junk = rest[m.end():].strip()
        spare = junk == SPARE
        if junk and not spare:
            raise HostfileError(f"{where}: unexpected text after the slot count: {junk!r} "
                                f"(only the word '{SPARE}' may follow it)")
        if host in hosts:
            raise HostfileError(f"{where}: duplicate host {host!r} (first listed on line {first_line[host]})")
        hosts[host] = slots
        first_line[host] = lineno
        if spare:
            found_spares.add(host)
    if not hosts:
        raise HostfileError(f"{path}: no hosts listed (expected lines like 'host1 slots=2')")
    if len(found_spares) == len(hosts):
        raise HostfileError(f"{path}: every host is marked '{SPARE}'; at least one must not be "
                            "(spares only replace lost hosts)")
    if spares is not None:
        spares.update(found_spares)
    return hosts


def parse_hostfile(path, spares: set | None = None) -> dict[str, int]:
    """Parse the hostfile at ``path`` into an ordered ``{host: slots}`` (spare hosts included; their
    names are added to ``spares`` when given); raises HostfileError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HostfileError(f"{p}: hostfile not found") from None
    except IsADirectoryError:
        raise HostfileError(f"{p}: is a directory, not a hostfile") from None
    except UnicodeDecodeError as exc:
        raise HostfileError(f"{p}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise HostfileError(f"{p}: cannot read hostfile: {exc.strerror}") from None
    return parse_hostfile_text(text, str(p), spares)
