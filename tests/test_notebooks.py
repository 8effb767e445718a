"""The notebooks: CI executes each one top to bottom in quick mode; the committed copies must
hold the outputs of a full run whose conclusions hold.

Quick mode (``FUSEDLP_QUICK=1``) shrinks sizes and repeats so every notebook runs in seconds;
an exception in any cell fails the test. The committed notebooks are checked as files: every
code cell has outputs, none is an error, none was produced in quick mode, and the last cell
of each study notebook — which re-checks each claim of the conclusion against the tables
above it — printed no failed claim.
"""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def _is_study(nb) -> bool:
    return any("studies.quick_from_env()" in c.source for c in nb.cells if c.cell_type == "code")


def test_there_are_study_notebooks():
    names = [p.name for p in NOTEBOOKS]
    for prefix in ("01_", "02_", "03_", "04_", "05_"):
        assert any(n.startswith(prefix) for n in names), f"no notebook {prefix}*.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_in_quick_mode(path, monkeypatch):
    monkeypatch.setenv("FUSEDLP_QUICK", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    if _is_study(nb):
        setup_out = "".join(str(o.get("data", {}).get("text/markdown", ""))
                            for o in nb.cells[1].outputs)
        assert "Quick mode" in setup_out, "the notebook did not see FUSEDLP_QUICK=1"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_has_full_run_outputs(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    for i, c in enumerate(code):
        assert c.outputs or not c.source.strip(), f"code cell {i} has no outputs"
        for o in c.outputs:
            assert o.output_type != "error", f"code cell {i} ended in {o.get('ename')}"
    if _is_study(nb):
        text = "".join(str(o.get("data", {}).get("text/markdown", "")) + str(o.get("text", ""))
                       for c in code for o in c.outputs)
        assert "Quick mode" not in text, "committed outputs come from a quick run"
        claims = "".join(str(o.get("text", "")) for o in code[-1].outputs)
        assert "holds" in claims, "the claims cell printed no verdicts"
        assert "FAILS" not in claims, f"a claim of the conclusion does not hold:\n{claims}"
