"""Names shared by every layer: the package version, the files of an adapter directory, the default model.

One definition each, so a reader, a writer and a test can never disagree about a file name.
"""

__version__ = "0.1.0"

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
SUMMARY_NAME = "trainable_summary.json"
README_NAME = "README.md"
BIAS_CHANGE_JSON = "bias_change.json"
BIAS_CHANGE_PNG = "bias_change.png"
PEFT_SUBFOLDER = "peft"  # a PEFT BEFT copy of the adapter, beside it (`bitfit-hf export-peft ADAPTER ADAPTER/peft`)
CHECKPOINT_COMPLETE_NAME = "checkpoint_complete.json"  # written last into a Trainer checkpoint folder
RUN_ARGS_NAME = "run_args.json"

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
