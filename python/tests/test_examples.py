"""The examples the README runs: examples/torch_schedule.py trains with a pipeweave schedule on
PyTorch's runtime with one device's losses and the plan's activation peaks."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_torch_schedule_example_trains_as_one_device():
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "torch_schedule.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(re.findall(r"largest relative difference 0\.0e\+00", done.stdout)) == 3, done.stdout
    peaks = re.findall(r"measured saved-activation peak ([\d.]+) microbatches \(plan: ([\d.]+)\)",
                       done.stdout)
    assert peaks == [("1.00", "1.00"), ("1.00", "1.00")], done.stdout
