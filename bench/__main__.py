"""``python -m bench [SUBCOMMAND] [OPTIONS]``: the benchmark entry point (also installed as
``fusedlp-bench``).

Each subcommand is a module of this package with ``add_arguments(parser)`` and
``main(args)``; the first line of its docstring is its one-line help. With no subcommand,
``studies`` runs. ``--help`` lists every subcommand's options.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from bench import (
        accuracy,
        contexts,
        fit,
        fuse,
        hessian,
        kernels,
        sharding,
        studies,
        summary,
        workloads,
    )

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="fusedlp benchmarks. With no subcommand, runs 'studies': five studies of "
                    "what gradients cost,\neach rerunning a public write-up with JAX and "
                    "fusedlp (the main job).",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    # each module has add_arguments(parser) and main(args); its docstring's first line is
    # the subcommand's help
    commands = {"studies": studies, "kernels": kernels, "contexts": contexts, "fit": fit,
                "fuse": fuse, "hessian": hessian, "sharding": sharding, "summary": summary,
                "accuracy": accuracy, "workloads": workloads}
    for name, module in commands.items():
        help_ = (module.__doc__ or name).strip().splitlines()[0].replace("``", "")
        p = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(p)
        p.set_defaults(run=module.main)
    parser.epilog = _options_of_every_subcommand(sub)
    return parser


def _options_of_every_subcommand(sub) -> str:
    """Each subcommand's options, as its own --help prints them, for the top-level --help."""
    parts = []
    for name, p in sub.choices.items():
        text = p.format_help()
        opts = text[text.find("options:"):].split("\n", 1)[1].rstrip()
        default = " (the default)" if name == "studies" else ""
        parts.append(f"python -m bench {name}{default}: {p.description}\n{opts}")
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["studies", *argv]  # no subcommand: `studies`
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
