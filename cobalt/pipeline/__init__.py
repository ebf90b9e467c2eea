"""The whole chain: its parameters (`params.py`: `PipelineParams`, what each stage gets, the
evaluation's protocol and seed), the settings a run prints before it starts (`settings_text.py`)
and its closing summary (`summary.py`). The flow is `flows/pipeline.py`, its Prefect tasks and
artifacts `tasks/pipeline.py`; docs/PIPELINE.md."""

from cobalt.pipeline.params import (
    PipelineParams,
    check_sets,
    evaluation_protocol,
    evaluation_seed,
    with_seed,
)
from cobalt.pipeline.settings_text import settings_text
from cobalt.pipeline.summary import PipelineSummary, hacking_rows, stage_table, summarize

__all__ = [
    "PipelineParams",
    "PipelineSummary",
    "check_sets",
    "evaluation_protocol",
    "evaluation_seed",
    "hacking_rows",
    "settings_text",
    "stage_table",
    "summarize",
    "with_seed",
]
