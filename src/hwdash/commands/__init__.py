"""Command-line subcommands. Each module has ``add_parser(subparsers)`` and ``run(args) -> int``."""
