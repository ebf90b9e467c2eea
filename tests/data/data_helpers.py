"""Helpers of the data-stage tests: sample paths, JSONL files, LiveCodeBench-encoded payloads.

Imported as `data_helpers` (pytest puts tests/data on sys.path), so plain `pytest` works too.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def encode_private(obj: object) -> str:
    """LiveCodeBench's encoding: base64(zlib(pickle(obj)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(obj))).decode()


class CallsSystem:
    """Unpickling this calls os.system: what a hostile payload does."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
