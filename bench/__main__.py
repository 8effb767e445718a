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
    p = sub.add_parser(
        "studies",
        help="the five seed studies (../shared/seeds): one markdown table each, the seed's "
             "ratios beside ours, and the README headline table",
        description=(studies.__doc__ or "").strip().splitlines()[0],
    )
    studies.add_arguments(p)
    p.set_defaults(run=studies.main)
    p = sub.add_parser(
        "kernels",
        help="time value / gradient / value-and-gradient of every kernel, N = 10 .. 1e7",
        description=(kernels.__doc__ or "").strip().splitlines()[0],
    )
    kernels.add_arguments(p)
    p.set_defaults(run=kernels.main)
    p = sub.add_parser(
        "fit",
        help="per-step cost of fusedlp.fit at N = 100 and 1e6 vs a Python loop, one v&g "
             "call and a numba v&g loop",
        description=(fit.__doc__ or "").strip().splitlines()[0],
    )
    fit.add_arguments(p)
    p.set_defaults(run=fit.main)
    p = sub.add_parser(
        "fuse",
        help="kernels built with fusedlp.fuse vs jax autodiff of the same formula, and a "
             "fuse-built normal vs normal_lpdf",
        description=(fuse.__doc__ or "").strip().splitlines()[0],
    )
    fuse.add_arguments(p)
    p.set_defaults(run=fuse.main)
    p = sub.add_parser(
        "sharding",
        help="sharded (4 forced CPU devices) vs unsharded value-and-gradient; with "
             "--throughput, bandwidth fraction on a GPU",
        description=(sharding.__doc__ or "").strip().splitlines()[0],
    )
    sharding.add_arguments(p)
    p.set_defaults(run=sharding.main)
    p = sub.add_parser("summary", help="README headline table from a kernels JSON")
    summary.add_arguments(p)
    p.set_defaults(run=summary.main)
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
