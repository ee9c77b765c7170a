"""What ``import bitfit_hf`` registers with transformers, deferred to ``transformers.pipelines``' import."""

from __future__ import annotations

from bitfit_hf.inference.hook import after_import


def register_pipelines() -> None:
    """Register the question-answering pipeline (see :mod:`bitfit_hf.inference.pipelines`)."""
    from bitfit_hf.inference.pipelines import register

    register()


def register_on_import() -> None:
    after_import("transformers.pipelines", register_pipelines)
