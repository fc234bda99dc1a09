"""The agents' lines on a shared stream: long lines framed into parts (events.frame/Unframer) and
Open MPI's tagged chunks put back into lines (runners/mpi.py TaggedStream), byte for byte."""

from __future__ import annotations

import json
import random

from dslaunch.launcher import events
from dslaunch.launcher.runners.mpi import TaggedStream


def test_a_short_line_goes_as_it_is():
    line = events.format_event("exit", rank=0)
    assert events.frame(line) == [line]
    assert events.Unframer().feed(line) == line


def test_long_lines_from_two_agents_mixed_part_by_part_come_back_whole():
    long_event = events.format_event("exit", rank=3, output_tail=["é" * 900, "x" * 2000])
    long_text = ("[host1:0] " + "ü" * 1500 + "\n").encode()
    a, b = events.frame(long_event), events.frame(long_text)
    assert len(a) > 1 and len(b) > 1
    assert all(len(p) <= events.MAX_LINE for p in a + b)
    mixed = [p for pair in zip(a, b) for p in pair] + a[len(b):] + b[len(a):]
    unframer = events.Unframer()
    got = [w for w in map(unframer.feed, mixed) if w is not None]
    assert sorted(got) == sorted([long_event, long_text])
    assert events.parse_event(next(g for g in got if g.startswith(b"@@")).decode())["rank"] == 3


def test_a_line_that_only_looks_framed_is_shown_as_it_is():
    line = events.PART_PREFIX + b"no numbers here\n"
    assert events.Unframer().feed(line) == line


def test_open_mpi_chunks_cut_anywhere_come_back_as_each_nodes_lines():
    rng = random.Random(0)
    wrote = {n: [json.dumps({"node": n, "i": i, "pad": "p" * rng.randrange(0, 3000)}).encode() + b"\n"
                 for i in range(30)] for n in (0, 1, 2)}
    pending = {n: b"".join(ls) for n, ls in wrote.items()}
    stream = b""
    while any(pending.values()):  # mpirun: a chunk of any length from any node, tagged
        n = rng.choice([k for k, v in pending.items() if v])
        cut = rng.randrange(1, 5000)
        chunk, pending[n] = pending[n][:cut], pending[n][cut:]
        stream += b"".join(b"[1,%d]<stdout>:" % n + piece for piece in chunk.splitlines(keepends=True))
    demux = TaggedStream("stdout")
    got = [w for raw in stream.splitlines(keepends=True) for w in demux.feed(raw)] + demux.rest()
    for n in wrote:
        assert [g for g in got if json.loads(g)["node"] == n] == wrote[n]


def test_mpiruns_own_untagged_text_passes_through():
    demux = TaggedStream("stderr")
    assert demux.feed(b"ORTE has lost communication\n") == [b"ORTE has lost communication\n"]
    assert demux.feed(b"[1,0]<stderr>:half") == [] and demux.rest() == [b"half\n"]


def test_open_mpi_5_tags_carry_a_space_and_the_version_is_read(tmp_path):
    from dslaunch.launcher.runners.mpi import open_mpi_major

    demux = TaggedStream("stdout", after=b" ")
    assert demux.feed(b"[1,1]<stdout>: half [1,0]<stdout>: zero\n") == [b"zero\n"]
    assert demux.feed(b"[1,1]<stdout>: line\n") == [b"half line\n"]
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.3'\n")
    fake.chmod(0o755)
    assert open_mpi_major(str(fake)) == 5
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
    assert open_mpi_major(str(fake)) == 4
    assert open_mpi_major(str(tmp_path / "absent")) == 4
