"""Methods: one folder per method (``config.py`` says what is trained, ``layer.py`` how one module changes,
``model.py`` walks the network, ``recipe.py`` what the recipes offer, ``method.py`` the registered :class:`Method`
with its hooks and card prose), plus what they share: the per-architecture role tables (``roles.py``), the bias
selection (``bias/``), the state kept on a model (``state.py``) and the registry (``registry.py``).

Every method config has a class attribute ``method`` (its registry name, stored in adapters) and
``learning_rate_for(role)``; every method's ``apply`` prepares a model in place and returns a state
with ``config``, ``selection`` (the trained tensors with their roles and layers), ``fingerprint``,
``added_biases`` and ``summary``, kept on the model (:func:`get_tuner_state`). A method that trains
only some entries of a tensor also gives ``sparse_indices`` (``{name: flat int64 indices}``): the
optimizer groups, the step guard and the adapter format handle those tensors generically. The trainer, the
adapter format, the reports and the recipes' arguments work through the registry only, so a new method is a new
folder that registers itself, plus its import line below.
"""

from bitfit_hf.tuners.registry import (  # noqa: F401 - the registry's interface
    METHODS,
    Method,
    MethodSpec,
    NotSupported,
    apply_method,
    bias_terms_of,
    config_from_dict,
    describe_method,
    method_label,
    method_spec,
    recipe_methods,
    register_method,
    released,
    tensor_role_of,
    training_penalty,
    unregister_method,
)
from bitfit_hf.tuners.state import get_tuner_state  # noqa: F401

# One line per method folder: importing it registers its methods, in this order (the recipes' --method order).
# isort: off
import bitfit_hf.tuners.bitfit  # noqa: E402,F401
import bitfit_hf.tuners.random_subset  # noqa: E402,F401
import bitfit_hf.tuners.adapterbias  # noqa: E402,F401
import bitfit_hf.tuners.bitfit_lora  # noqa: E402,F401
import bitfit_hf.tuners.bitfit_ia3  # noqa: E402,F401
import bitfit_hf.tuners.ln_tuning  # noqa: E402,F401
# isort: on
