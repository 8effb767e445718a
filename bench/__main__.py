"""``python -m bench [SUBCOMMAND] ...``: the benchmark entry point.

Subcommands:
  studies   the five seed studies, one table each, and the headline table (the default)
  kernels   fused kernels vs jax autodiff vs hand-written numba loops, N = 10 .. 1e7
  fit       per-step cost of fusedlp.fit's compiled loop vs a Python loop and one v&g call
  fuse      fusedlp.fuse-built kernels vs jax autodiff of the same formula, N = 1e3 .. 1e6
  sharding  value-and-gradient sharded over 4 forced CPU devices vs 1 device; GPU throughput
  summary   the README headline table, read from the kernels JSON
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from bench import fit, fuse, kernels, sharding, studies, summary

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="fusedlp benchmarks. With no subcommand, runs `studies` (every seed study).",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    # each module has add_arguments(parser) and main(args); its docstring's first line is
    # the subcommand's help
    commands = {"studies": studies, "kernels": kernels, "fit": fit, "fuse": fuse,
                "sharding": sharding, "summary": summary}
    for name, module in commands.items():
        help_ = (module.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(p)
        p.set_defaults(run=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["studies", *argv]  # no subcommand: `studies`
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
