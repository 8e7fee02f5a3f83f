"""The README's quickstart: its code is examples/quickstart.py's, and the standalone
commands it gives do what it says (train to the end; the same command again trains
nothing and exits 0). Its Tune entry point runs in the main example's place, by hand."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "quickstart.py"


def test_the_readme_shows_the_example_as_it_is():
    readme = (REPO / "README.md").read_text()
    match = re.search(r"<!-- quickstart: examples/quickstart.py -->\n```python\n(.*?)\n```",
                      readme, re.DOTALL)
    assert match, "README.md lost its quickstart block"
    assert match.group(1) in EXAMPLE.read_text(), \
        "README.md's quickstart differs from examples/quickstart.py: copy the file's train()"


def test_the_standalone_commands_train_then_find_the_job_finished(tmp_path, subprocess_env):
    command = [sys.executable, "-m", "adaptdl_core.launch", "--checkpoint-path",
               str(tmp_path / "ckpt"), str(EXAMPLE)]
    first = subprocess.run(command, env=subprocess_env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    epochs = re.findall(r"'epoch': (\d+)", first.stdout)
    assert epochs == ["0", "1", "2", "3", "4"], first.stdout
    again = subprocess.run(command, env=subprocess_env, capture_output=True, text=True,
                           timeout=300)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output
    assert "job already finished (5 epochs); nothing to do" in output
    assert "'epoch'" not in again.stdout, output
