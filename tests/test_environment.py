"""Environment propagation: prefixes, env files, --env, precedence, literal values, errors."""

from pathlib import Path

import pytest

from dslaunch.launcher.environment import EnvError, collect_env, is_secret

HOSTILE = "it's $(touch f) `touch g` $HOME \"q\" \\ end  "


@pytest.fixture
def dirs(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    return home, cwd


def test_prefixes_and_exclusions(dirs):
    home, cwd = dirs
    environ = {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/a:/b", "PYTHONHOME": "/x", "PATH": "/usr/bin",
               "LD_LIBRARY_PATH": "/l", "CUDA_VISIBLE_DEVICES": "0", "CUDA_LAUNCH_BLOCKING": "1",
               "GLOO_SOCKET_IFNAME": "eth0", "HOME": "/root", "DSLAUNCH_CONFIG": "{}", "RANK": "3",
               "DSLAUNCH_RESTART_COUNT": "2", "DSLAUNCH_CONFIG_PATH": "/old.json", "DSLAUNCH_X": "y",
               "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "4", "WANDB_MODE": "offline"}
    env = collect_env([], cwd, home, environ=environ)
    assert env["NCCL_DEBUG"] == ("INFO", "environ (prefix NCCL_)")
    assert env["PYTHONPATH"] == ("/a:/b", "environ (prefix PYTHON)")
    assert env["GLOO_SOCKET_IFNAME"][0] == "eth0"
    assert env["TOKENIZERS_PARALLELISM"] == ("false", "environ")
    assert env["CUDA_LAUNCH_BLOCKING"][0] == "1"
    assert env["OMP_NUM_THREADS"][0] == "4"
    assert env["WANDB_MODE"][0] == "offline"
    assert env["DSLAUNCH_X"] == ("y", "environ (prefix DSLAUNCH_)")
    for name in ("PYTHONHOME", "PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "HOME",
                 "DSLAUNCH_CONFIG", "RANK", "DSLAUNCH_RESTART_COUNT", "DSLAUNCH_CONFIG_PATH"):
        assert name not in env, name


def test_files_precedence_and_sources(dirs):
    home, cwd = dirs
    (home / ".deepspeed_env").write_text("A=home-ds\nB=home-ds\n")
    (home / ".dslaunch_env").write_text("# comment\n\nB=home-dsl\nC=home-dsl\n")
    (cwd / ".deepspeed_env").write_text("C=cwd-ds\nexport D=cwd-ds\n")
    (cwd / ".dslaunch_env").write_text("NCCL_DEBUG=WARN\n")
    env = collect_env(["D=cli", "E=cli"], cwd, home, environ={"NCCL_DEBUG": "INFO"})
    assert env == {
        "A": ("home-ds", "~/.deepspeed_env:1"),
        "B": ("home-dsl", "~/.dslaunch_env:3"),
        "C": ("cwd-ds", "./.deepspeed_env:1"),
        "D": ("cli", "--env"),
        "E": ("cli", "--env"),
        "NCCL_DEBUG": ("WARN", "./.dslaunch_env:1"),
    }


def test_values_are_literal_and_byte_identical(dirs):
    home, cwd = dirs
    (cwd / ".dslaunch_env").write_bytes(("X=" + HOSTILE + "\nY=a=b=c\nZ=\nW=\xe9\xff\r\n").encode("latin-1"))
    env = collect_env(["CLI=" + HOSTILE + "\nline2", "EMPTY="], cwd, home, environ={})
    assert env["X"][0] == HOSTILE
    assert env["Y"][0] == "a=b=c"
    assert env["Z"][0] == ""
    assert env["W"][0].encode("utf-8", "surrogateescape") == b"\xe9\xff"
    assert env["CLI"][0] == HOSTILE + "\nline2"
    assert env["EMPTY"][0] == ""
    assert not (cwd / "f").exists() and not Path("f").exists()


def test_ds_env_file_names_the_deepspeed_file(dirs, tmp_path):
    home, cwd = dirs
    (cwd / "my.env").write_text("A=1\n")
    (cwd / ".deepspeed_env").write_text("B=ignored\n")
    env = collect_env([], cwd, home, environ={"DS_ENV_FILE": "my.env"})
    assert env == {"A": ("1", "./my.env:1")}
    absolute = tmp_path / "abs.env"
    absolute.write_text("C=3\n")
    env = collect_env([], cwd, home, environ={"DS_ENV_FILE": str(absolute)})
    assert env == {"C": ("3", f"{absolute}:1")}
    with pytest.raises(EnvError, match="DS_ENV_FILE=missing.env: no such file"):
        collect_env([], cwd, home, environ={"DS_ENV_FILE": "missing.env"})


def test_same_dir_read_once(dirs):
    home, _ = dirs
    (home / ".dslaunch_env").write_text("A=1\n")
    assert collect_env([], home, home, environ={}) == {"A": ("1", "~/.dslaunch_env:1")}


@pytest.mark.parametrize("text,line,needle", [
    ("A=1\nnot an assignment\n", 2, "expected KEY=VALUE"),
    ("A=1\n\n1BAD=x\n", 3, "invalid variable name '1BAD'"),
    ("MY VAR=x\n", 1, "invalid variable name 'MY VAR'"),
    ("RANK=3\n", 1, "RANK is set by the launcher"),
])
def test_file_errors_name_file_and_line(dirs, text, line, needle):
    home, cwd = dirs
    (cwd / ".dslaunch_env").write_text(text)
    with pytest.raises(EnvError) as ei:
        collect_env([], cwd, home, environ={})
    assert str(ei.value).startswith(f"./.dslaunch_env:{line}: ")
    assert needle in str(ei.value)


@pytest.mark.parametrize("item,needle", [
    ("NOVALUE", "--env: expected KEY=VALUE, got 'NOVALUE'"),
    ("=x", "invalid variable name ''"),
    ("MASTER_PORT=1", "MASTER_PORT is set by the launcher"),
])
def test_cli_errors(dirs, item, needle):
    home, cwd = dirs
    with pytest.raises(EnvError) as ei:
        collect_env([item], cwd, home, environ={})
    assert needle in str(ei.value)


def test_is_secret():
    assert is_secret("HF_TOKEN") and is_secret("WANDB_API_KEY") and is_secret("AWS_SECRET_ACCESS_KEY")
    assert not is_secret("NCCL_DEBUG")
