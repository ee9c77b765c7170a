"""Per-task preprocessing and post-processing used by the recipes.

* :mod:`.classification` -- GLUE / GLUE-style sentence(-pair) classification and regression;
* :mod:`.tagging` -- token classification (Penn Treebank POS): first-sub-token label alignment;
* :mod:`.qa` -- extractive QA (SQuAD v1.1): ``doc_stride`` windows, offsets, n-best post-processing.
"""
