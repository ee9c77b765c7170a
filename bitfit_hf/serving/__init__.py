"""``bitfit-hf serve``: many task adapters on one frozen base over HTTP, with mixed-task dynamic batching.

``config`` (what is served, the limits), ``models`` (the shared base, mixed and switched adapter groups),
``tasks`` (inputs and answers per task type), ``batcher`` (the one worker thread and its bounded queue),
``engine`` (all of it together), ``metrics`` (Prometheus), ``app`` (the FastAPI routes), ``server``
(uvicorn, foreground or in a thread). Needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client);
see docs/serving.md.
"""
