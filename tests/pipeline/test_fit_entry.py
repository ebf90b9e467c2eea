"""`python -m cobalt.reference` (what `make run` runs beside the sandbox's install) fits the
reference model exactly where the pipeline flow's reference-model task looks for it."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from cobalt import models, reference
from cobalt.models import RECIPE_FILE, models_dir, resolve_model
from cobalt.pipeline import PipelineParams
from cobalt.storage import StorageConfig


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


def test_resolving_fitted_logs_which_build_it_is(tmp_path, monkeypatch, caplog):
    """One recipe fits other weights on another kind of CPU: the log names both."""
    built = tmp_path / "fitted"
    built.mkdir()
    (built / RECIPE_FILE).write_text(json.dumps({"hash": "0123abcd0123abcd"}))
    (built / "model.safetensors").write_bytes(b"the weights")
    monkeypatch.setattr(models, "_fit_embedded", lambda path, steps: built)
    caplog.set_level(logging.INFO, logger="cobalt.models")
    storage = StorageConfig(url=str(tmp_path / "runs"))
    assert resolve_model("fitted", storage, str(tmp_path / "work")) == str(built)
    digest = hashlib.sha256(b"the weights").hexdigest()[:16]
    assert f"the fitted model: recipe 0123abcd0123abcd, weights {digest}" in caplog.text
