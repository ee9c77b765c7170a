"""The two files that make a saved transformers folder a sentence-transformers checkpoint."""

from __future__ import annotations

import json

OLD_MEAN = {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}


def write_sentence_transformers_files(folder, pooling: dict, pooling_dir: str = "1_Pooling") -> None:
    """``modules.json`` (Transformer, Pooling, Normalize) and the Pooling module's ``config.json``."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": pooling_dir, "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / pooling_dir).mkdir()
    (folder / pooling_dir / "config.json").write_text(json.dumps(pooling))
