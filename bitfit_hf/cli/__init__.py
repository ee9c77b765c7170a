"""``bitfit-hf``: one entry point with verbs, in the style of ``accelerate`` and ``hf``.

Each verb lives in a module of its own with ``register(subparsers)``; heavy libraries (torch,
transformers) are imported inside the verbs, so ``bitfit-hf --help`` answers at once.
"""
