"""`python -m cobalt.reference` (what `make run` runs beside the sandbox's install) fits the
reference model exactly where the pipeline flow's reference-model task looks for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cobalt import reference
from cobalt.models import models_dir
from cobalt.pipeline import PipelineParams


def test_fits_where_the_flow_reuses_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fitted: list[tuple[Path, int]] = []
    monkeypatch.setattr(
        reference, "fit_embedded", lambda path, steps: fitted.append((path, steps)) or path
    )
    assert reference.main([]) == 0
    params = PipelineParams()
    expected = models_dir(params.storage, params.work_dir) / "fitted-seed0"
    assert fitted == [(expected, params.fit_steps)]
    assert expected.resolve().is_relative_to(tmp_path.resolve())  # ./runs, as make run's flow
    assert capsys.readouterr().out.strip() == str(expected)


def test_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit) as exit_:
        reference.main(["--help"])
    assert exit_.value.code == 0
    assert "Docker" in capsys.readouterr().out
