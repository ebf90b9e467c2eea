"""Read the scalars of TensorBoard event files (the training curves `report_to` writes), without
TensorBoard: TFRecord framing (length, CRC, record, CRC) around tensorboardX's Event protos."""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

from tensorboardX.proto import event_pb2


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag under `directory` (recursively) -> its (step, value) points."""
    found: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            record = data[at + 12 : at + 12 + length]
            at += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found[value.tag].append((event.step, value.simple_value))
    return dict(found)
