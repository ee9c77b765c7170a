"""`import bitfit_hf` registers the question-answering pipeline without importing torch: the registration waits
for `transformers.pipelines`' import (fresh interpreters, so nothing is imported beforehand)."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_package_loads_no_torch_and_registers_later():
    out = _run("import sys, bitfit_hf; print('torch' in sys.modules, 'transformers.pipelines' in sys.modules); "
               "from transformers import pipelines; "
               "print(pipelines.PIPELINE_REGISTRY.check_task('question-answering')[1]['impl'].__name__)")
    assert out.splitlines() == ["False False", "ExtractiveQuestionAnsweringPipeline"]


def test_registered_at_once_when_transformers_pipelines_is_already_imported():
    out = _run("import transformers.pipelines as p, bitfit_hf; "
               "print(p.PIPELINE_REGISTRY.check_task('question-answering')[1]['impl'].__name__)")
    assert out == "ExtractiveQuestionAnsweringPipeline"
