"""Hostfile parsing: order, comments, and one clear file:line error per kind of mistake."""

import pytest

from dslaunch.launcher import hostfile
from dslaunch.launcher.hostfile import HostfileError, parse_hostfile


def write(tmp_path, text):
    p = tmp_path / "hostfile"
    p.write_text(text)
    return p


def test_order_comments_blank_lines(tmp_path):
    p = write(tmp_path, "# cluster\n\nworker-2 slots=4   # fat node\n  worker-1 slots=2\n\t\n"
                        "w3.example.com slots = 1\n")
    hosts = parse_hostfile(p)
    assert list(hosts.items()) == [("worker-2", 4), ("worker-1", 2), ("w3.example.com", 1)]


def test_accepts_str_path(tmp_path):
    p = write(tmp_path, "a slots=1\n")
    assert parse_hostfile(str(p)) == {"a": 1}


@pytest.mark.parametrize("text,line,needle", [
    ("a slots=2\nb slots=1\na slots=3\n", 3, "duplicate host 'a' (first listed on line 1)"),
    ("a slots=2\nb\n", 2, "has no slot count"),
    ("a slots=2\n\nb slots=two\n", 3, "'two' for host 'b' is not an integer"),
    ("a slots=0\n", 1, "must be positive, got 0"),
    ("a slots=-2\n", 1, "must be positive, got -2"),
    ("a slots=2 gpus=3\n", 1, "unexpected text after the slot count: 'gpus=3'"),
    ("a slots=2 extra # c\n", 1, "unexpected text after the slot count: 'extra'"),
    ("a 4\n", 1, "expected 'slots=N'"),
    ("a slots=\n", 1, "empty slot count"),
    ("a slots=2.5\n", 1, "not an integer"),
    ("-oProxyCommand=x slots=1\n", 1, "invalid host name"),
    ("a;touch slots=1\n", 1, "invalid host name"),
])
def test_errors_name_file_and_line(tmp_path, text, line, needle):
    p = write(tmp_path, text)
    with pytest.raises(HostfileError) as ei:
        parse_hostfile(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert needle in msg
    assert "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(HostfileError, match="hostfile not found"):
        parse_hostfile(tmp_path / "nope")


def test_directory(tmp_path):
    with pytest.raises(HostfileError, match="is a directory"):
        parse_hostfile(tmp_path)


def test_empty_file_is_an_error(tmp_path):
    p = write(tmp_path, "# only a comment\n\n")
    with pytest.raises(HostfileError, match="no hosts listed"):
        parse_hostfile(p)


def test_default_hostfile(tmp_path, monkeypatch):
    monkeypatch.setattr(hostfile, "DEFAULT_HOSTFILE", tmp_path / "hostfile")
    assert hostfile.default_hostfile() is None
    write(tmp_path, "a slots=1\n")
    assert hostfile.default_hostfile() == tmp_path / "hostfile"
    assert str(hostfile.DEFAULT_HOSTFILE).endswith("hostfile")
