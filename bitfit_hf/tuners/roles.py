"""The paper's bias roles, resolved per architecture to exact module paths.

BitFit names bias vectors by what they do (``b_q``, ``b_m2``, ...), while every architecture names the
modules differently. Each table below maps a role to a regular expression over *module* names (the
bias parameter is ``<module>.bias``); a match must cover the whole name after an optional prefix that
ends with a dot, so ``encoder.layer.0.output.dense`` can never match
``encoder.layer.0.attention.output.dense`` (the official code's substring matching did exactly that).

A role may address one chunk of a fused projection (GPT-2's ``c_attn`` holds q, k and v biases end
to end): such an entry carries ``(chunk index, number of chunks)`` and training masks the gradient
outside that chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

# Roles of the paper (Table 1 / Figure 1 of Ben Zaken et al.), plus the biases outside the layers.
PAPER_ROLES: Dict[str, str] = {
    "b_q": "attention query projection",
    "b_k": "attention key projection",
    "b_v": "attention value projection",
    "b_m1": "attention output projection",
    "b_LN1": "LayerNorm after (post-LN) or before (pre-LN) attention",
    "b_m2": "MLP expansion ('middle of MLP')",
    "b_m3": "MLP output projection",
    "b_LN2": "LayerNorm after (post-LN) or before (pre-LN) the MLP",
}
EXTRA_ROLES: Dict[str, str] = {
    "b_emb_LN": "embeddings LayerNorm",
    "b_pooler": "pooler dense layer",
    "b_final_LN": "final LayerNorm of a pre-LN stack",
    "b_xq": "cross-attention query projection",
    "b_xk": "cross-attention key projection",
    "b_xv": "cross-attention value projection",
    "b_xm1": "cross-attention output projection",
    "b_xLN": "LayerNorm of the cross-attention block",
}
# Gains (the ``weight`` of a LayerNorm / RMSNorm) sit in the same modules as the norm biases: each gain
# role resolves through its bias role's rules and selects ``<module>.weight`` instead of ``.bias``.
GAIN_ROLES: Dict[str, str] = {
    "g_LN1": "gain of the LayerNorm after (post-LN) or before (pre-LN) attention",
    "g_LN2": "gain of the LayerNorm after (post-LN) or before (pre-LN) the MLP",
    "g_emb_LN": "gain of the embeddings LayerNorm",
    "g_final_LN": "gain of the final LayerNorm of a pre-LN stack",
    "g_xLN": "gain of the LayerNorm of the cross-attention block",
}
GAIN_OF: Dict[str, str] = {"g_LN1": "b_LN1", "g_LN2": "b_LN2", "g_emb_LN": "b_emb_LN", "g_final_LN": "b_final_LN",
                           "g_xLN": "b_xLN"}
ALL_ROLES: Dict[str, str] = {**PAPER_ROLES, **EXTRA_ROLES, **GAIN_ROLES}

# Presets: a name for a set of roles, or a special meaning handled by the selector.
PRESETS: Dict[str, Optional[Tuple[str, ...]]] = {
    "all": None,  # every bias parameter of the model (plus added biases for every role)
    "one-d": None,  # every bias and every LayerNorm / RMSNorm gain: all 1-D vectors of the layers
    "paper-subset": ("b_q", "b_m2"),  # the paper's 0.04% subset
    "frozen": (),  # head only
    "full": None,  # every parameter: the full fine-tuning baseline
}


@dataclass(frozen=True)
class RoleRule:
    """One way a role shows up in an architecture: a module-path regex and an optional fused chunk."""

    module_regex: str
    chunk: Optional[Tuple[int, int]] = None  # (index, count) inside a fused bias vector

    def compiled(self) -> "re.Pattern[str]":
        return _compile(self.module_regex)


_COMPILED: Dict[str, "re.Pattern[str]"] = {}


def _compile(module_regex: str) -> "re.Pattern[str]":
    if module_regex not in _COMPILED:
        _COMPILED[module_regex] = re.compile(r"(?:.+\.)?" + module_regex)
    return _COMPILED[module_regex]


def _in_layer(layer_regex: str, roles: Dict[str, str]) -> Dict[str, List[RoleRule]]:
    """Roles whose module is ``<tail>`` under a layer path matched by ``layer_regex`` (which names the
    ``layer`` group, and ``stack`` for encoder-decoders, and ends with a dot)."""
    return {role: [RoleRule(layer_regex + tail)] for role, tail in roles.items()}


def _layered(prefix: str, roles: Dict[str, str]) -> Dict[str, List[RoleRule]]:
    """Roles whose module sits under ``<prefix>.<layer index>.``."""
    return _in_layer(prefix + r"\.(?P<layer>\d+)\.", roles)


_BERT_LIKE = {
    **_layered(
        r"encoder\.layer",
        {
            "b_q": r"attention\.self\.query",
            "b_k": r"attention\.self\.key",
            "b_v": r"attention\.self\.value",
            "b_m1": r"attention\.output\.dense",
            "b_LN1": r"attention\.output\.LayerNorm",
            "b_m2": r"intermediate\.dense",
            "b_m3": r"output\.dense",
            "b_LN2": r"output\.LayerNorm",
        },
    ),
    "b_emb_LN": [RoleRule(r"embeddings\.LayerNorm")],
    "b_pooler": [RoleRule(r"pooler\.dense")],
}

_DEBERTA_V2 = {
    **_BERT_LIKE,
    **_layered(
        r"encoder\.layer",
        {"b_q": r"attention\.self\.query_proj", "b_k": r"attention\.self\.key_proj", "b_v": r"attention\.self\.value_proj"},
    ),
}

_MPNET = {
    **_layered(
        r"encoder\.layer",
        {
            "b_q": r"attention\.attn\.q",
            "b_k": r"attention\.attn\.k",
            "b_v": r"attention\.attn\.v",
            "b_m1": r"attention\.attn\.o",
            "b_LN1": r"attention\.LayerNorm",
            "b_m2": r"intermediate\.dense",
            "b_m3": r"output\.dense",
            "b_LN2": r"output\.LayerNorm",
        },
    ),
    "b_emb_LN": [RoleRule(r"embeddings\.LayerNorm")],
    "b_pooler": [RoleRule(r"pooler\.dense")],
}

_DISTILBERT = {
    **_layered(
        r"transformer\.layer",
        {
            "b_q": r"attention\.q_lin",
            "b_k": r"attention\.k_lin",
            "b_v": r"attention\.v_lin",
            "b_m1": r"attention\.out_lin",
            "b_LN1": r"sa_layer_norm",
            "b_m2": r"ffn\.lin1",
            "b_m3": r"ffn\.lin2",
            "b_LN2": r"output_layer_norm",
        },
    ),
    "b_emb_LN": [RoleRule(r"embeddings\.LayerNorm")],
}

_GPT2 = {
    "b_q": [RoleRule(r"h\.(?P<layer>\d+)\.attn\.c_attn", chunk=(0, 3))],
    "b_k": [RoleRule(r"h\.(?P<layer>\d+)\.attn\.c_attn", chunk=(1, 3))],
    "b_v": [RoleRule(r"h\.(?P<layer>\d+)\.attn\.c_attn", chunk=(2, 3))],
    **_layered(
        r"h",
        {
            "b_m1": r"attn\.c_proj",
            "b_LN1": r"ln_1",
            "b_m2": r"mlp\.c_fc",
            "b_m3": r"mlp\.c_proj",
            "b_LN2": r"ln_2",
        },
    ),
    "b_final_LN": [RoleRule(r"ln_f")],
}

_LLAMA_LIKE = {
    **_layered(
        r"layers",
        {
            "b_q": r"self_attn\.q_proj",
            "b_k": r"self_attn\.k_proj",
            "b_v": r"self_attn\.v_proj",
            "b_m1": r"self_attn\.o_proj",
            "b_LN1": r"input_layernorm",
            "b_m3": r"mlp\.down_proj",
            "b_LN2": r"post_attention_layernorm",
        },
    ),
    # A gated MLP has two expanding projections; both are "the middle of the MLP".
    "b_m2": [
        RoleRule(r"layers\.(?P<layer>\d+)\.mlp\.gate_proj"),
        RoleRule(r"layers\.(?P<layer>\d+)\.mlp\.up_proj"),
    ],
    # Only a module whose own name is ``norm`` (the final RMSNorm); per-layer norms are ``*_layernorm``.
    "b_final_LN": [RoleRule(r"norm")],
}

_T5_STACK = r"(?P<stack>encoder|decoder)\.block\.(?P<layer>\d+)\."
_T5 = {
    "b_q": [RoleRule(_T5_STACK + r"layer\.0\.SelfAttention\.q")],
    "b_k": [RoleRule(_T5_STACK + r"layer\.0\.SelfAttention\.k")],
    "b_v": [RoleRule(_T5_STACK + r"layer\.0\.SelfAttention\.v")],
    "b_m1": [RoleRule(_T5_STACK + r"layer\.0\.SelfAttention\.o")],
    "b_LN1": [RoleRule(_T5_STACK + r"layer\.0\.layer_norm")],
    "b_xq": [RoleRule(_T5_STACK + r"layer\.1\.EncDecAttention\.q")],
    "b_xk": [RoleRule(_T5_STACK + r"layer\.1\.EncDecAttention\.k")],
    "b_xv": [RoleRule(_T5_STACK + r"layer\.1\.EncDecAttention\.v")],
    "b_xm1": [RoleRule(_T5_STACK + r"layer\.1\.EncDecAttention\.o")],
    "b_xLN": [RoleRule(_T5_STACK + r"layer\.1\.layer_norm")],
    "b_m2": [RoleRule(_T5_STACK + r"layer\.[12]\.DenseReluDense\.wi(?:_0|_1)?")],
    "b_m3": [RoleRule(_T5_STACK + r"layer\.[12]\.DenseReluDense\.wo")],
    "b_LN2": [RoleRule(_T5_STACK + r"layer\.[12]\.layer_norm")],
    "b_final_LN": [RoleRule(r"(?:encoder|decoder)\.final_layer_norm")],
}
# The FFN LayerNorm sits in sub-layer 1 of encoder blocks and sub-layer 2 of decoder blocks, while
# sub-layer 1 of a decoder block is cross-attention: pin each stack to its own index.
_T5["b_LN2"] = [
    RoleRule(r"(?P<stack>encoder)\.block\.(?P<layer>\d+)\.layer\.1\.layer_norm"),
    RoleRule(r"(?P<stack>decoder)\.block\.(?P<layer>\d+)\.layer\.2\.layer_norm"),
]
_T5["b_xLN"] = [RoleRule(r"(?P<stack>decoder)\.block\.(?P<layer>\d+)\.layer\.1\.layer_norm")]

_ALBERT_LAYER = r"encoder\.albert_layer_groups\.(?P<layer>\d+)\.albert_layers\.\d+\."
# ALBERT shares one set of layer weights across all layers: a "layer" here is a layer group (one by default).
_ALBERT = {
    **_in_layer(_ALBERT_LAYER, {
        "b_q": r"attention\.query",
        "b_k": r"attention\.key",
        "b_v": r"attention\.value",
        "b_m1": r"attention\.dense",
        "b_LN1": r"attention\.LayerNorm",
        "b_m2": r"ffn",
        "b_m3": r"ffn_output",
        "b_LN2": r"full_layer_layer_norm",
    }),
    "b_emb_LN": [RoleRule(r"embeddings\.LayerNorm")],
    "b_pooler": [RoleRule(r"albert\.pooler")],
}

# BART, mBART and OPT (fairseq lineage) name a layer's modules alike; the per-layer
# ``final_layer_norm`` is the MLP's LayerNorm, not the stack's.
_FAIRSEQ_LAYER = {
    "b_q": r"self_attn\.q_proj",
    "b_k": r"self_attn\.k_proj",
    "b_v": r"self_attn\.v_proj",
    "b_m1": r"self_attn\.out_proj",
    "b_LN1": r"self_attn_layer_norm",
    "b_m2": r"fc1",
    "b_m3": r"fc2",
    "b_LN2": r"final_layer_norm",
}
_FAIRSEQ_CROSS = {
    "b_xq": r"encoder_attn\.q_proj",
    "b_xk": r"encoder_attn\.k_proj",
    "b_xv": r"encoder_attn\.v_proj",
    "b_xm1": r"encoder_attn\.out_proj",
    "b_xLN": r"encoder_attn_layer_norm",
}
_SEQ2SEQ_LAYER = r"(?P<stack>encoder|decoder)\.layers\.(?P<layer>\d+)\."
_BART_LIKE = {
    **_in_layer(_SEQ2SEQ_LAYER, {**_FAIRSEQ_LAYER, **_FAIRSEQ_CROSS}),
    "b_emb_LN": [RoleRule(r"(?:encoder|decoder)\.layernorm_embedding")],
    "b_final_LN": [RoleRule(r"(?:encoder|decoder)\.layer_norm")],  # mBART's pre-LN stacks
}

_OPT = {
    **_layered(r"decoder\.layers", _FAIRSEQ_LAYER),
    "b_final_LN": [RoleRule(r"decoder\.final_layer_norm")],
}

# Phi runs attention and the MLP in parallel from one LayerNorm, so there is no b_LN2.
_PHI = {
    **_layered(
        r"layers",
        {
            "b_q": r"self_attn\.q_proj",
            "b_k": r"self_attn\.k_proj",
            "b_v": r"self_attn\.v_proj",
            "b_m1": r"self_attn\.dense",
            "b_LN1": r"input_layernorm",
            "b_m2": r"mlp\.fc1",
            "b_m3": r"mlp\.fc2",
        },
    ),
    "b_final_LN": [RoleRule(r"final_layernorm")],
}

ARCHITECTURE_ROLES: Dict[str, Dict[str, List[RoleRule]]] = {
    "bert": _BERT_LIKE,
    "roberta": _BERT_LIKE,
    "xlm-roberta": _BERT_LIKE,
    "camembert": _BERT_LIKE,
    "electra": _BERT_LIKE,
    "data2vec-text": _BERT_LIKE,
    "ernie": _BERT_LIKE,
    "deberta-v2": _DEBERTA_V2,
    "mpnet": _MPNET,
    "distilbert": _DISTILBERT,
    "gpt2": _GPT2,
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
    "t5": _T5,
    "mt5": _T5,
    "albert": _ALBERT,
    "bart": _BART_LIKE,
    "mbart": _BART_LIKE,
    "opt": _OPT,
    "phi": _PHI,
}


def roles_for(model_type: str) -> Dict[str, List[RoleRule]]:
    """The role table of an architecture; a clear error for one we do not know."""
    try:
        return ARCHITECTURE_ROLES[model_type]
    except KeyError:
        raise ValueError(
            f"bitfit-hf has no bias-role table for model_type {model_type!r}. "
            f"Known: {', '.join(sorted(ARCHITECTURE_ROLES))}. Use bias_terms='all' (every bias parameter) "
            "or `patterns=[...]` (regular expressions over parameter names) instead."
        ) from None


def rules_of(table: Dict[str, List[RoleRule]], role: str) -> Optional[List[RoleRule]]:
    """The rules of ``role`` in an architecture's table (a gain role uses its norm's bias rules)."""
    return table.get(GAIN_OF.get(role, role))


def parameter_of(role: str) -> str:
    """The attribute a role trains on its module: ``weight`` for a gain role, else ``bias``."""
    return "weight" if role in GAIN_OF else "bias"


HEAD = "head"  # the role of the task head's tensors
ROLE_KINDS = ("bias", "gain", "pattern", "weight", "random", HEAD)
"""What a trained tensor can be besides a paper role, in display order after the roles."""


def role_rank(role: str, extra: Iterable[str] = ()) -> int:
    """Display order: the paper's roles, then roles a method adds (``extra``), then other biases,
    gains, patterns, weights, random entries and the head."""
    order = list(ALL_ROLES) + list(extra) + list(ROLE_KINDS)
    return order.index(role) if role in order else len(order)


def module_roles(table: Dict[str, List[RoleRule]], module_name: str, roles: Optional[Iterable[str]] = None):
    """``(role, rule, layer)`` for every rule of ``table`` (limited to ``roles``; gain roles use their norm's
    rules) covering ``module_name``."""
    for role in (table if roles is None else roles):
        for rule in rules_of(table, role) or ():
            layer = match_role(rule, module_name)
            if layer is not None:
                yield role, rule, layer


def match_role(rule: RoleRule, module_name: str) -> Optional[str]:
    """The layer label of ``module_name`` if the rule covers it exactly, else ``None``.

    The label is the layer index (``"3"``), prefixed by the stack for encoder-decoders
    (``"decoder.3"``), or ``""`` for a bias outside the layers.
    """
    found = rule.compiled().fullmatch(module_name)
    if found is None:
        return None
    groups = found.groupdict()
    layer = groups.get("layer") or ""
    stack = groups.get("stack")
    return f"{stack}.{layer}" if stack else layer
