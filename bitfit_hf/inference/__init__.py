"""From a task's inputs to its answers, once for every front end: ``bitfit-hf predict``, ``bitfit-hf serve``
and the ``transformers.pipeline`` route all call this layer, so they cannot disagree.

``inputs`` (text-embeddings-inference's layouts -> items, the checks an adapter's recorded inputs allow,
tokenizing: one feature per text, overlapping windows for QA), ``answers`` (logits -> labels with scores,
word tags, answer spans), ``batches`` (padding features into a batch and cutting each row's outputs back
out, for any runner), ``predictor`` (the in-process runner ``predict`` uses), ``pipelines`` (the
``question-answering`` pipeline transformers 5 dropped, registered on ``import bitfit_hf``) and ``hook``
(the registration, deferred until ``transformers.pipelines`` is imported, so importing this package stays
free of torch).
"""
