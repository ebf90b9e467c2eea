"""The runner's source text, sent to each sandbox as `python3 -c` (no project code in the image)."""

from pathlib import Path

RUNNER_SOURCE = (Path(__file__).with_name("runner.py")).read_text()
