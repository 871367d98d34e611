"""The error every command raises for a mistake it reports in one line and exit status 2."""

from __future__ import annotations


class CliError(Exception):
    """A problem to report in one line (bad flag values, unreachable addresses)."""
