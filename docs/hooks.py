"""MkDocs hooks: the benchmark tables and the notebook pages.

* ``<!-- bench-summary -->`` in a page becomes every table ``python -m bench summary
  --results docs/results`` prints, and ``<!-- bench-summary: NAME -->`` one section of it,
  read from the JSON committed in ``docs/results/`` when the site is built.
* Every committed notebook (``notebooks/NN_*.ipynb``, shown through the ``docs/notebooks``
  link) gets a page under "Notebooks" in the navigation, so a new one cannot be left out.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
MARKER = re.compile(r"<!-- bench-summary(?::\s*(\w+))? -->")


def on_config(config):
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)  # the bench package, for the tables
    notebooks = sorted(f for f in os.listdir(os.path.join(ROOT, "notebooks"))
                       if re.match(r"\d\d_.*\.ipynb$", f))
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Notebooks" in entry:
            entry["Notebooks"] = [f"notebooks/{f}" for f in notebooks]
    return config


def on_page_markdown(markdown, page, config, files):
    if "<!-- bench-summary" not in markdown:
        return markdown
    from bench import summary

    def tables(match):
        sections = (match.group(1),) if match.group(1) else summary.SECTIONS
        return summary.render(RESULTS, sections)

    return MARKER.sub(tables, markdown)
