"""The main job's command line: ``python -m bench`` runs the seed studies.

One small study in quick mode through the real entry point, checking what the README and
the issue promise of it: a markdown table per study and the headline table on stdout, the
JSON (machine record, rows, correctness checks) and one PNG per study.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("numba")
pytest.importorskip("matplotlib")


def _bench(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def test_quick_study_writes_tables_json_and_plot(tmp_path):
    out_json, plots = tmp_path / "s.json", tmp_path / "plots"
    p = _bench("--quick", "--study", "broadcast", "--json", str(out_json), "--plots", str(plots))
    assert p.returncode == 0, p.stderr
    assert "## Gradient of Σ exp(x)" in p.stdout
    assert "## Headline:" in p.stdout
    assert "| broadcast | 1,000 |" in p.stdout
    doc = json.loads(out_json.read_text())
    assert doc["quick"] is True
    assert doc["machine"]["jax"] and doc["machine"]["backend"] == "cpu"
    (res,) = doc["results"]
    assert res["study"] == "broadcast" and res["checks"]
    timed = [r for r in res["rows"] if r["median_s"] is not None]
    assert timed and all(r["median_s"] > 0 and r["repeats"] >= 5 for r in timed)
    assert all(r["compile_s"] is not None for r in timed)
    assert (plots / "broadcast.png").stat().st_size > 10_000


def test_unknown_study_is_an_error(tmp_path):
    p = _bench("--quick", "--study", "nope", "--json", str(tmp_path / "x.json"))
    assert p.returncode != 0
    assert "unknown study" in p.stderr
