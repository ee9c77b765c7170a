"""The trainable summary is shared by every method: see :mod:`bitfit_hf.tuners.summary`."""

from bitfit_hf.tuners.summary import TrainableSummary

__all__ = ["TrainableSummary"]
