"""AdapterBias (Fu et al., NAACL 2022): a token-dependent shift ``L_alpha(h) * v`` on every FFN output
projection, trained with the FFN and embeddings LayerNorms and the task head."""

from bitfit_hf.tuners.adapterbias.config import AdapterBiasConfig
from bitfit_hf.tuners.adapterbias.method import AdapterBias
from bitfit_hf.tuners.adapterbias.model import apply_adapterbias, insert_shifts
from bitfit_hf.tuners.registry import register_method

register_method(AdapterBias)

__all__ = ["AdapterBiasConfig", "apply_adapterbias", "insert_shifts"]
