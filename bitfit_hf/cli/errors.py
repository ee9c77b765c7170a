"""The error a verb raises for input it checks itself."""

from bitfit_hf.utils.errors import UserError


class CliError(UserError):
    """Bad command-line input found by a verb (a missing file, a wrong kind of adapter)."""
