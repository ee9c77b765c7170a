"""The task types an adapter's config stores: peft's ``TaskType`` names, kept as plain strings so a config reads
and writes as a peft one does (and importing this costs no peft import)."""

SEQ_CLS = "SEQ_CLS"
TOKEN_CLS = "TOKEN_CLS"
QUESTION_ANS = "QUESTION_ANS"
CAUSAL_LM = "CAUSAL_LM"
SEQ_2_SEQ_LM = "SEQ_2_SEQ_LM"
MASKED_LM = "MASKED_LM"
MULTIPLE_CHOICE = "MULTIPLE_CHOICE"

ANSWERED = (SEQ_CLS, TOKEN_CLS, QUESTION_ANS)  # what `bitfit-hf predict`, the pipelines and the server answer
LABELLED = (SEQ_CLS, TOKEN_CLS)  # heads sized by ``num_labels``

__all__ = ["ANSWERED", "CAUSAL_LM", "LABELLED", "MASKED_LM", "MULTIPLE_CHOICE", "QUESTION_ANS", "SEQ_2_SEQ_LM",
           "SEQ_CLS", "TOKEN_CLS"]
