"""A pipeline stage whose first layer works in place on the activation it receives
(``ReLU(inplace=True)``, as DeepSpeedExamples' AlexNet pipeline starts its second stage): the
engine hands the forward clones of the received leaves (tests/scripts/pipe_inplace.py), so it
trains, and to plain PyTorch's losses on one process (same layers, same micro-batches; SGD, fp32:
equal within 1e-6 relative). Before: "a view of a leaf Variable that requires grad is being used
in an in-place operation" on stage 1.
"""

import json

import pytest

from helpers import launch, run_python

pytestmark = pytest.mark.slow


def test_second_stage_starting_in_place_trains_like_one_process(tmp_path):
    run_python("pipe_inplace.py", ["--reference", "--out", tmp_path])
    launch(tmp_path, None, "pipe_inplace.py", ["--out", tmp_path])
    ref = json.loads((tmp_path / "ref.json").read_text())["losses"]
    stages = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert stages[1]["layers"][0] == "ReLU"  # the case itself: stage 1 starts in place
    for stage in stages:
        assert len(stage["losses"]) == len(ref)
        assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(stage["losses"], ref)), \
            (stage["losses"], ref)
