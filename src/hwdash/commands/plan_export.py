"""``hwdash plan --export``: the plan written as a trainer's config, to stdout or to ``-o FILE``.

An existing file is overwritten only with ``--force``; ``--check`` refuses to write for a flavor the
plan does not fit, and without it such an export is written with a warning.
"""

from __future__ import annotations

import sys
from typing import Any

from hwdash.errors import UsageError


def exists_message(output: str) -> str:
    """The refusal to overwrite ``output`` without ``--force``."""
    return f"'{output}' already exists: add --force to overwrite it"


def export(
    kind: str,
    report: Any,
    catalog: Any,
    output: str | None,
    *,
    check: tuple[int, str] | None = None,
    force: bool = False,
) -> int:
    """Write the plan as ``kind`` to ``output`` (stdout when None; an existing file only with
    ``force``). ``check``: ``--check``'s (status, line) for the plan's flavor: a failed check
    writes nothing and returns its status. Without one, an export for a flavor the plan does not
    fit (or only tightly) is written with a warning."""
    from hwdash.commands.plan_fit import check_line
    from hwdash.core.plans.exports import export_flavor_id, export_text

    try:
        text, notes = export_text(kind, report, catalog)
    except ValueError as exc:
        raise UsageError(str(exc), flag="--export") from None
    # With the export on stdout, stdout is the export alone: the check's line goes to stderr.
    check_stream = sys.stdout if output is not None else sys.stderr
    if check is not None and check[0] != 0:
        print(check[1], file=check_stream)
        print(f"hwdash: --check failed: the {kind} export was not written", file=sys.stderr)
        return check[0]
    flavor_id = export_flavor_id(report)
    if check is None and flavor_id is not None:
        status, line = check_line(report, flavor_id)
        if status != 0:
            print(
                f"hwdash: warning: {line} (the {kind} export is written for it anyway; "
                "--check refuses it)",
                file=sys.stderr,
            )
    for note in notes:
        print(f"hwdash: {note}", file=sys.stderr)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            with open(output, "w" if force else "x", encoding="utf-8") as handle:
                handle.write(text)
        except FileExistsError:
            raise UsageError(exists_message(output), flag="-o") from None
        except OSError as exc:
            raise UsageError(f"cannot write '{output}': {exc.strerror or exc}", flag="-o") from None
        print(f"wrote {output}", file=sys.stderr)
    if check is not None:
        print(check[1], file=check_stream)
        return check[0]
    return 0
