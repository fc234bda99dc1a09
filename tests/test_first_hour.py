"""A newcomer's first hour (issue 46): the commands the README names, typed as a user types them
(the installed ``dslaunch`` entry point as a subprocess, real files in tmp_path), give the right
answer the first time.

3. Every plain-text table the CLI prints lines up whatever the names (``cpu_block_sparse_attn``).
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import dslaunch

# A rank script that imports nothing heavy: it records its argv (what the script was given).
ARGV_SCRIPT = """\
import json, os, sys
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "rank_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def _script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(ARGV_SCRIPT)
    return path


def _ranks_argv(tmp_path, nproc=2) -> list:
    return [json.loads((tmp_path / "out" / f"rank_{r}.json").read_text()) for r in range(nproc)]


def _error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.strip()]


# ---- 3. every plain table lines up whatever the names ----------------------------------------------

def _columns_line_up(header: str, rows: list, align: str) -> None:
    """Each row's cells start (``<``) or end (``>``) where the header's do."""
    names = header.split()
    starts, pos = [], 0
    for name in names:
        pos = header.index(name, pos)
        starts.append(pos)
        pos += len(name)
    ends = [s + len(n) for s, n in zip(starts, names)]
    for row in rows:
        for i, a in enumerate(align):
            if a == "<":
                assert row[starts[i]] != " " and (starts[i] == 0 or row[starts[i] - 1] == " "), \
                    (header, row)
            else:
                assert row[ends[i] - 1] != " " and row[ends[i]] == " ", (header, row)


def test_report_op_table_lines_up_with_long_op_names():
    r = dslaunch("report")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = lines.index(next(line for line in lines
                         if line.split() == ["op", "kind", "compatible", "built", "loaded", "status"]))
    header, rows = lines[i], lines[i + 1:]
    assert any(row.startswith("cpu_block_sparse_attn ") for row in rows)
    _columns_line_up(header, rows, "<<<<<<")


def test_estimate_memory_table_lines_up():
    r = dslaunch("estimate-memory", "--params", "7B", "--world-size", "64")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[1]
    rows = [line for line in lines[2:] if line.startswith("  stage")]
    assert len(rows) >= 5
    # "per rank device" is three words: compare the right edges of the number columns
    heads = ["per rank device", "per rank cpu", "per host device", "per host cpu", "per rank nvme"]
    ends = [header.index(h) + len(h) for h in heads]
    for row in rows:
        for end in ends:
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (header, row)


def test_straggler_report_lines_up_with_long_host_names(tmp_path):
    rows = [{"rank": r, "host": host, "step_time": st, "compute": c, "collectives": st - c,
             "first_step": 1, "last_step": 9}
            for r, host, st, c in [(0, "a", 0.5, 0.4), (1, "a-very-long-host-name.example.org", 0.5, 0.4),
                                   (2, "b", 12.5, 12.0), (10, "b", 0.5, 0.45)]]
    (tmp_path / "status.json").write_text(json.dumps({"ranks": [], "job": rows, "state": "done"}))
    r = dslaunch("top", "--log-dir", tmp_path, "--stragglers")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("rank"))
    header = lines[i]
    table = lines[i + 1:i + 5]
    assert "<- straggler" in table[2]
    for row in table:  # right edges of rank / the three times, left edge of host
        for name in ("rank", "step time", "compute", "in collectives"):
            end = header.index(name) + len(name)
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (header, row)
        start = header.index("host")
        assert row[start] != " " and row[start - 1] == " ", (header, row)


def test_text_table_widths_come_from_the_cells():
    from dslaunch.launcher.text_table import text_table

    lines = text_table([("op", "n", "status"), ("cpu_block_sparse_attn", 3, "ok"), ("a", 12345, "")],
                       align="<>")
    assert lines == ["op                         n  status",
                     "cpu_block_sparse_attn      3  ok",
                     "a                      12345"]
