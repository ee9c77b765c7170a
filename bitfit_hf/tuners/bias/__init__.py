"""BitFit's bias selection, shared by every method defined relative to one (``bitfit``, ``bitfit_lora``,
``bitfit_ia3``, ``rand_uniform`` / ``rand_row_col``): ``config.py`` (``BitFitConfig``), ``selection.py`` (roles
-> exact tensors), ``layer.py`` (added biases), ``model.py`` (``apply_bitfit``), ``quantized.py`` (biases on
quantized bases). Not a method folder: method folders import it and :mod:`bitfit_hf.tuners.state`, never one
another."""
