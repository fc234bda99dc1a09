"""Plain-text tables whose columns line up whatever the cells hold: each column is as wide as its
widest cell (the header included), never a fixed width that a long name would break. Used by every
plain table the CLI and the launcher print (``dslaunch report``, ``estimate-memory``, the preflight
table, the straggler report); the CLI's rich tables size their columns themselves.
"""

from __future__ import annotations


def text_table(rows: list, align: str = "", gap: str = "  ", indent: str = "") -> list:
    """``rows`` (the first one the header; every row as many cells as the header) as lines.
    ``align``: one character per column, ``<`` (left, the default) or ``>`` (right). The last
    column is not padded (no trailing blanks), so it may hold free text of any length."""
    cells = [[str(c) for c in row] for row in rows]
    if not cells:
        return []
    ncol = len(cells[0])
    widths = [max(len(row[i]) for row in cells) for i in range(ncol)]
    aligns = (align + "<" * ncol)[:ncol]
    lines = []
    for row in cells:
        padded = [c.rjust(w) if a == ">" else c.ljust(w)
                  for c, w, a in zip(row[:-1], widths, aligns)]
        last = row[-1].rjust(widths[-1]) if aligns[-1] == ">" else row[-1]
        lines.append((indent + gap.join(padded + [last])).rstrip())
    return lines
