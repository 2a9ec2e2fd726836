"""The command line run in the test's own process, for the command tests:

    rc, out, err = cli(["theory", "bert-tiny", "--json"], capsys)

``cli(argv, capsys)`` runs `splitformer ARGV` through ``splitformer.cli.main`` and returns
(exit status, stdout, stderr); argparse's SystemExit (usage errors: 2, --help: 0) becomes the
status.
"""

from __future__ import annotations

from splitformer.cli import main


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run `splitformer ARGV` in this process: (exit status, stdout, stderr)."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err
