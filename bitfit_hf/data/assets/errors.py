"""The errors of the offline assets: one base class, so a caller (the CLI, the recipes) catches them all."""

from __future__ import annotations

from bitfit_hf.utils.errors import UserError

__all__ = ["AssetError", "AssetNotFoundError", "AssetChecksumError", "AssetDownloadError"]


class AssetError(UserError):
    """Base class of every error raised by :mod:`bitfit_hf.data.assets`."""


class AssetNotFoundError(AssetError, FileNotFoundError):
    """An asset is neither installed nor cached; the message names the fixing command."""


class AssetChecksumError(AssetError, ValueError):
    """A file does not have the recorded SHA-256 (or size)."""


class AssetDownloadError(AssetError, RuntimeError):
    """pip could not download a source archive, or the archive lacks the member."""
