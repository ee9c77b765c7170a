"""The error every method raises when a selection cannot be made (unknown role, invalid pattern,
nothing selected): user input, so the recipes and ``bitfit-hf`` print it as one ``error:`` line."""

from bitfit_hf.utils.errors import UserError


class SelectionError(UserError, ValueError):
    """What to train does not fit the model (or selects nothing); the message names the roles, presets
    and the model's bias parameters."""
