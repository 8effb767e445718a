"""Every fenced Python block of README.md and of the documentation pages runs as written.

Each file's ```python blocks are executed in order, in one namespace, in a fresh interpreter
(so that a page can set jax's options or XLA_FLAGS before jax starts, as a reader would), and
the run must exit cleanly. The blocks print what their text claims; the output is shown when
a block fails.
"""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

RUNNER = """
import sys
blocks = {blocks!r}
namespace = {{"__name__": "__main__"}}
for i, block in enumerate(blocks):
    print(f"--- block {{i + 1}} of {{len(blocks)}}", flush=True)
    exec(compile(block, f"{name} block {{i + 1}}", "exec"), namespace)
"""


def _blocks(path: pathlib.Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def test_the_pages_have_python_blocks():
    assert _blocks(ROOT / "README.md"), "README.md has no ```python block"
    assert len(PAGES) > 5, "docs/*.md not found"


@pytest.mark.parametrize("path", [p for p in PAGES if _blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, tmp_path):
    pytest.importorskip("numpyro")  # docs/jax-and-numpyro.md; in the test extra
    code = RUNNER.format(blocks=_blocks(path), name=path.name)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, f"{path.name}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
