"""A griffe extension for the API reference: the docstrings' reStructuredText markup as Markdown.

fusedlp's docstrings are Google style with a little reStructuredText inside (roles such as
``:func:`fit``` and ``:math:`\\sigma```, and ``.. math::`` blocks). mkdocstrings reads
Markdown, so this rewrites them when the package is loaded: roles become code spans, math
becomes ``\\( … \\)`` and ``\\[ … \\]`` for MathJax (``pymdownx.arithmatex``), and ````x````
becomes ```x```.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|data|mod|meth|attr|obj|exc):`~?([^`]+)`")
MATH_ROLE = re.compile(r":math:`([^`]+)`")
DOUBLE_TICKS = re.compile(r"``([^`]+)``")


def _math_blocks(text: str) -> str:
    """``.. math:: body`` (inline or indented on the following lines) as ``\\[ body \\]``."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)\.\. math::\s*(.*)$", lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, body = m.group(1), [m.group(2)] if m.group(2).strip() else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or
                                  len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        out += [f"{indent}\\[", *(f"{indent}{b}" for b in body if b), f"{indent}\\]", ""]
    return "\n".join(out)


def to_markdown(text: str) -> str:
    text = _math_blocks(text)
    text = MATH_ROLE.sub(lambda m: f"\\({m.group(1)}\\)", text)
    text = ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return DOUBLE_TICKS.sub(lambda m: f"`{m.group(1)}`", text)


class RstToMarkdown(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
