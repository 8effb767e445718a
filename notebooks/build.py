"""Write and execute the study notebooks: ``python notebooks/build.py [--only 01,03] [--quick]``.

Each notebook is assembled here from its text (question, conclusion) and a fixed set of code
cells that call the study in ``bench/studies``, then executed top to bottom with nbclient
from the ``notebooks/`` folder and saved with its outputs. The committed notebooks are the
outputs of a full run (no ``--quick``); CI re-executes them in quick mode
(``FUSEDLP_QUICK=1``, see tests/test_notebooks.py) and does not save them.

The conclusions are written after reading a full run's tables; the last cell of each notebook
re-checks every claim of its conclusion against the numbers above it and prints the verdicts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from notebooks._text import NOTEBOOKS

SETUP = """\
# Setup: the repository root on the path (bench/ lives there), float64, quick mode from the
# environment (FUSEDLP_QUICK=1 runs small sizes with few repeats, as CI does).
import inspect
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by numpyro
sys.path.insert(0, os.path.abspath(".."))
import matplotlib.pyplot as plt
from IPython.display import Code, Markdown, display

from bench import studies
from bench.studies import {module} as study
from bench.studies._core import figure, median, row

machine = studies.setup()
QUICK = studies.quick_from_env()
display(Markdown(studies.header(machine)
                 + (" **Quick mode** (FUSEDLP_QUICK=1): small sizes, few repeats; the figures"
                    " below are not the ones the conclusion was written from." if QUICK else "")))"""

CODE = """\
# What is timed: every variant, exactly as the benchmark builds it (bench/studies/{module}.py).
Code(inspect.getsource(study.variants), language="python")"""

RUN = """\
# Run the study: correctness checks first (every gradient against the reference), then
# compile each variant, then time all variants of one n round-robin (median of many calls).
result = study.run(quick=QUICK)
display(Markdown(studies.study_markdown(result)))"""

PLOT = """\
# Top: median time against n (log-log), a few variants per panel; fusedlp in red with hollow
# markers. Bottom: the write-up's ratios beside ours.
fig = figure(result, study.comparison(result), study.PLOT_PANELS)
plt.show()"""

CLAIMS_HEAD = """\
# Each claim of the conclusion, re-checked against the tables above (in quick mode the sizes
# are smaller and the timings rougher, so a claim may fail there without anything being wrong).
studies_sizes = sorted({r["n"] for r in result["rows"] if r["variant"] == "value"})


def claim(text, holds):
    # holds=None: the sizes the claim speaks of were not run (quick mode)
    print(("n/a     " if holds is None else "holds   " if holds else "FAILS   ") + text)
    return holds

"""


def build(nb_spec: dict) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    mod = nb_spec["module"]
    cells = [
        nbformat.v4.new_markdown_cell(nb_spec["intro"].strip()),
        nbformat.v4.new_code_cell(SETUP.format(module=mod)),
        nbformat.v4.new_markdown_cell(nb_spec["code_md"].strip()),
        nbformat.v4.new_code_cell(CODE.format(module=mod)),
        nbformat.v4.new_markdown_cell("## The tables"),
        nbformat.v4.new_code_cell(RUN),
        nbformat.v4.new_markdown_cell("## The plot"),
        nbformat.v4.new_code_cell(PLOT),
        nbformat.v4.new_markdown_cell("## Conclusion\n\n" + nb_spec["conclusion"].strip()),
        nbformat.v4.new_code_cell(CLAIMS_HEAD + nb_spec["claims"].strip()),
    ]
    nb.cells = cells
    return nb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated notebook prefixes, e.g. 01,04")
    p.add_argument("--quick", action="store_true",
                   help="execute in quick mode (for trying the build; do not commit these)")
    p.add_argument("--no-execute", action="store_true")
    p.add_argument("--sync-text", action="store_true",
                   help="only rewrite the markdown cells from _text.py, keeping the code "
                        "cells and their outputs (for wording fixes after a full run)")
    args = p.parse_args(argv)
    only = args.only.split(",") if args.only else None
    if args.quick:
        os.environ["FUSEDLP_QUICK"] = "1"
    else:
        os.environ.pop("FUSEDLP_QUICK", None)
    for spec in NOTEBOOKS:
        if only and not any(spec["file"].startswith(o) for o in only):
            continue
        nb = build(spec)
        path = os.path.join(HERE, spec["file"])
        if args.sync_text:
            old = nbformat.read(path, as_version=4)
            assert [c.cell_type for c in old.cells] == [c.cell_type for c in nb.cells]
            for new_cell, old_cell in zip(nb.cells, old.cells):
                if new_cell.cell_type == "markdown":
                    old_cell.source = new_cell.source
                else:
                    assert old_cell.source == new_cell.source, f"{spec['file']}: code changed"
            nbformat.write(old, path)
            print(f"synced the text of {spec['file']}")
            continue
        if not args.no_execute:
            t0 = time.perf_counter()
            NotebookClient(nb, timeout=1200, kernel_name="python3",
                           resources={"metadata": {"path": HERE}}).execute()
            print(f"executed {spec['file']} in {time.perf_counter() - t0:.0f} s", flush=True)
        nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
