"""The live job view's table (rich), for ``dslaunch run --monitor`` and ``dslaunch top``: one row
per rank from ``jobview.py``'s rows.

On a terminal the table redraws in place (rich's Live) and the ranks' output scrolls above it;
elsewhere (a file, a pipe, a test) nothing is redrawn and the final table is printed once.
"""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table

COLUMNS = ("rank", "host", "step", "step time", "compute", "in collectives", "tokens/s", "memory",
           "heartbeat", "state")


def _seconds(value) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _bytes(value) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def _memory(row: dict) -> str:
    text = f"RSS {_bytes(row.get('rss'))}"
    if row.get("device_mem") is not None:
        text += f", GPU {_bytes(row['device_mem'])}"
    return text


def _age(value) -> str:
    return "-" if value is None else f"{value:.1f} s ago"


def table(rows: list, title: str = "dslaunch job", age_offset: float = 0.0) -> Table:
    """The table of ``rows``; ``age_offset`` (seconds) is added to each heartbeat age (a status
    file read some time after it was written)."""
    t = Table(title=title, title_justify="left")
    for name in COLUMNS:
        t.add_column(name, justify="left" if name in ("host", "memory", "state") else "right",
                     no_wrap=True)
    for r in rows:
        tps = r.get("tokens_per_s")
        age = r.get("heartbeat_age")
        t.add_row(str(r["rank"]), r["host"], "-" if r.get("step") is None else str(r["step"]),
                  _seconds(r.get("step_time")), _seconds(r.get("compute")),
                  _seconds(r.get("collectives")), "-" if tps is None else f"{tps:,.0f}",
                  _memory(r), _age(None if age is None else age + age_offset),
                  r.get("state", ""))
    return t


def console(file=None, force_terminal: bool | None = None) -> Console:
    """A console on ``file``; off a terminal, wide enough that no column is cut."""
    c = Console(file=file, force_terminal=force_terminal, soft_wrap=True)
    return c if c.is_terminal else Console(file=file, force_terminal=force_terminal,
                                           soft_wrap=True, width=max(c.width, 160))


class Monitor:
    """``dslaunch run --monitor``: the table on ``file`` (the launcher's stdout), redrawn in place
    on a terminal; the ranks' lines and the launcher's messages go through ``print`` above it."""

    def __init__(self, file, force_terminal: bool | None = None):
        self.console = console(file, force_terminal)
        self.interactive = self.console.is_terminal and not self.console.is_dumb_terminal
        self.live: Live | None = None
        self.title = "dslaunch job"

    def start(self) -> None:
        if self.interactive and self.live is None:
            self.live = Live(console=self.console, auto_refresh=False, transient=False)
            self.live.start()

    def update(self, rows: list, title: str) -> None:
        self.title = title
        if self.live is not None:
            self.live.update(table(rows, title), refresh=True)

    def print(self, text: str) -> None:
        """A line of output (newline included) above the table."""
        self.console.print(text, end="", markup=False, highlight=False, emoji=False)

    def stop(self, rows: list, title: str) -> None:
        """The final table: drawn in place on a terminal, printed once elsewhere."""
        if self.live is not None:
            self.live.update(table(rows, title), refresh=True)
            self.live.stop()
            self.live = None
        else:
            self.console.print(table(rows, title))
