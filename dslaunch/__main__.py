"""``python -m dslaunch ...``: the CLI without its console script (a checkout, or a python with no venv)."""

from dslaunch.cli import main

main()
