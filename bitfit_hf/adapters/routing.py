"""Per-example adapter routing at the layer: the one contract by which every method serves a mixed batch.

A mixed batch runs the stock model once. Each module some adapter changes gets a :class:`LayerAdapters`, which
holds that module's adapters by name (``add``, ``delete``, ``set_active``) and, during a routed forward pass,
changes each example's output with its own adapter's tensors, picked by a per-example index from tables of one row
per active adapter plus a last row for the stock model. What an adapter does to a module is one of a few *kinds*
of change, each exact for the module it is attached to:

* ``bias``: a bias delta added to the output (``nn.Linear``, ``Conv1D``, norms, biases bitfit-hf adds);
* ``gain``: a norm's gain delta times its normalised input (LayerNorm tuning, AdapterBias, BitFit's ``one-d``);
* ``lora``: ``scaling * B A x`` added to the output (LoRA; ranks may differ between adapters);
* ``shift``: ``L_alpha(h) * v`` added to the output (AdapterBias's token-dependent shift);
* ``scale_out`` / ``scale_in``: the output, or the input, multiplied by a vector ((IA)³).

Additive changes come first and scaling last, so a module with a bias delta and an (IA)³ vector computes
``(W x + b_t) * l_t`` as peft's (IA)³ layer does. A method says where its own stored tensors act
(:meth:`~bitfit_hf.tuners.registry.Method.route`); module biases and norm gains are routed without asking it.
Tables are built once per change of the active set, so a forward pass only gathers rows.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from bitfit_hf.tuners import method_spec
from bitfit_hf.tuners.bias.layer import HOOK_ATTR
from bitfit_hf.tuners.bias.selection import is_norm
from bitfit_hf.tuners.routes import ANY_SHIFT, KINDS, Route
from bitfit_hf.utils.names import is_under

__all__ = ["KINDS", "LayerAdapters", "Route", "Router", "TokenRows", "route_of", "stock_route"]


def _additive_bias(module: nn.Module) -> bool:
    """Whether ``module``'s bias is added to its output."""
    if isinstance(module, (nn.Linear, nn.LayerNorm)) or hasattr(module, HOOK_ATTR) or type(module).__name__ == "Conv1D":
        return True
    return is_norm(module)


def stock_route(modules: Mapping[str, nn.Module], name: str) -> Optional[Route]:
    """The route of a stock tensor: a module's additive bias, or a norm's gain; None for anything else."""
    module_name, _, attr = name.rpartition(".")
    module = modules.get(module_name)
    if module is None:
        return None
    if attr == "bias" and _additive_bias(module):
        return Route(module_name, "bias")
    if attr == "weight" and is_norm(module):
        return Route(module_name, "gain")
    return None


def route_of(model: nn.Module, modules: Mapping[str, nn.Module], method: str, name: str,
             method_config: Mapping) -> Optional[Route]:
    """Where a stored tensor of a ``method`` adapter acts: the method's own route, else a stock one."""
    found = method_spec(method).route(model, name, method_config)
    return found if found is not None else stock_route(modules, name)


class LayerAdapters:
    """One module's adapters by name, and its per-example change in a routed forward.

    ``stock(kind)`` gives the module's own value of what a kind replaces (its bias, its gain): the tables hold
    each adapter's difference from it, so the stock row changes nothing."""

    def __init__(self, name: str, module: nn.Module, stock: Callable[[str], Optional[torch.Tensor]]):
        self.name = name
        self.module = module
        self._stock = stock
        self._adapters: Dict[str, Dict[Tuple[str, str], Tuple[torch.Tensor, float]]] = {}
        self._active: List[str] = []
        self._tables: Optional[Dict[str, Dict[str, torch.Tensor]]] = None

    @property
    def names(self) -> List[str]:
        return list(self._adapters)

    def add(self, adapter: str, route: Route, tensor: torch.Tensor) -> None:
        """Hold ``tensor`` as ``adapter``'s part ``route.kind`` / ``route.slot`` of this module."""
        self._adapters.setdefault(adapter, {})[(route.kind, route.slot)] = (tensor.detach(), route.scale)
        self._tables = None

    def delete(self, adapter: str) -> None:
        self._adapters.pop(adapter, None)
        self._tables = None

    def set_active(self, adapters: Sequence[str]) -> None:
        """The adapters an index picks, in order; index ``len(adapters)`` is the stock module."""
        self._active = list(adapters)
        self._tables = None

    def has(self, adapter: str, kind: str) -> bool:
        return any(k == kind for k, _ in self._adapters.get(adapter, {}))

    def kinds(self) -> List[str]:
        return [k for k in KINDS if k in self.tables()]

    # ---- tables ----------------------------------------------------------------------------------------------
    def tables(self) -> Dict[str, Dict[str, torch.Tensor]]:
        if self._tables is None:
            self._tables = self._build()
        return self._tables

    def _part(self, adapter: str, kind: str, slot: str = "") -> Optional[Tuple[torch.Tensor, float]]:
        return self._adapters.get(adapter, {}).get((kind, slot))

    def _build(self) -> Dict[str, Dict[str, torch.Tensor]]:
        """Per kind, rows for the active adapters that have it and a last, neutral row, with ``index`` mapping an
        adapter index (the stock model's too) to its row: an adapter without the kind costs no row."""
        rows = self._active
        tables: Dict[str, Dict[str, torch.Tensor]] = {}
        for kind in KINDS:
            members = [a for a in rows if self.has(a, kind)]
            if not members:
                continue
            build = {"bias": self._delta_table, "gain": self._delta_table, "scale_in": self._scale_table,
                     "scale_out": self._scale_table, "lora": self._lora_table, "shift": self._shift_table}[kind]
            table = build(kind, members)
            if table is None:
                continue
            index = torch.full((len(rows) + 1,), len(members), dtype=torch.long)
            for row, adapter in enumerate(members):
                index[rows.index(adapter)] = row
            table["index"] = index.to(next(iter(table.values())).device)
            tables[kind] = table
        return tables

    def _delta_table(self, kind: str, members: Sequence[str]) -> Optional[Dict[str, torch.Tensor]]:
        """``delta``: each adapter's value less the stock one (None when every delta is zero)."""
        stock = self._stock(kind)
        like = self._part(members[0], kind)[0].reshape(-1)
        base = stock.reshape(-1).to(like) if stock is not None else torch.zeros_like(like)
        table = torch.stack([self._part(a, kind)[0].reshape(-1).to(base) - base for a in members]
                            + [torch.zeros_like(base)])
        return {"delta": table} if bool(table.any()) else None

    def _scale_table(self, kind: str, members: Sequence[str]) -> Dict[str, torch.Tensor]:
        like = self._part(members[0], kind)[0].reshape(-1)
        return {"l": torch.stack([self._part(a, kind)[0].reshape(-1).to(like) for a in members] + [torch.ones_like(like)])}

    def _lora_table(self, kind: str, members: Sequence[str]) -> Optional[Dict[str, torch.Tensor]]:
        """``A``: ``[rows, r_max, in]``, ``B``: ``[rows, out, r_max]`` with the scaling folded in; ranks below the
        largest are padded with zeros (which add nothing)."""
        pairs = [(self._part(a, "lora", "A"), self._part(a, "lora", "B")) for a in members]
        if not all(a and b for a, b in pairs):
            raise ValueError(f"{self.name!r}: an adapter holds one LoRA matrix of the pair")
        rank = max(a[0].shape[0] for a, _ in pairs)
        a0, b0 = pairs[0][0][0], pairs[0][1][0]
        A = a0.new_zeros(len(members) + 1, rank, a0.shape[1])  # noqa: N806 - LoRA's names
        B = b0.new_zeros(len(members) + 1, b0.shape[0], rank)  # noqa: N806
        for row, (a, b) in enumerate(pairs):
            r = a[0].shape[0]
            A[row, :r] = a[0].to(A)
            B[row, :, :r] = b[0].to(B) * b[1]
        return {"A": A, "B": B}

    def _shift_table(self, kind: str, members: Sequence[str]) -> Dict[str, torch.Tensor]:
        """``w``: ``[rows, d_ff]`` and ``c``: ``[rows]`` (L_alpha), ``v``: ``[rows, d]``; the neutral row zero."""
        parts = [[self._part(a, "shift", s) for s in ("v", "w", "c")] for a in members]
        if not all(v and w for v, w, _ in parts):
            raise ValueError(f"{self.name!r}: an adapter holds a shift vector without its L_alpha, or the reverse")
        v0, w0 = parts[0][0][0], parts[0][1][0]
        v = v0.new_zeros(len(members) + 1, v0.numel())
        w = w0.new_zeros(len(members) + 1, w0.numel())
        c = w0.new_zeros(len(members) + 1)
        for row, (pv, pw, pc) in enumerate(parts):
            v[row], w[row] = pv[0].reshape(-1).to(v), pw[0].reshape(-1).to(w)
            if pc:
                c[row] = pc[0].reshape(-1).to(c)[0]
        return {"v": v, "w": w, "c": c}

    # ---- the forward pass ------------------------------------------------------------------------------------
    def change_input(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        table = self.tables().get("scale_in")
        if table is None:
            return x
        return (x.to(table["l"].dtype) * _rows(table, "l", ids, x)).to(x.dtype)  # peft: (x.to(l) * l).to(x)

    def bias_rows(self) -> Optional[torch.Tensor]:
        """The bias deltas with one row per adapter index (the stock model's last): ``[active + 1, features]``,
        or None where no active adapter changes this module's bias."""
        table = self.tables().get("bias")
        return None if table is None else table["delta"].index_select(0, table["index"])

    def change_output(self, x: torch.Tensor, out: torch.Tensor, ids: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``bias``: each example's bias delta for this module, ``[batch, 1, features]``, as :meth:`Router.route`
        gathers every module's at once (None where no active adapter changes this module's bias)."""
        tables = self.tables()
        if not tables or tables.keys() == {"scale_in"}:
            return out
        _check_layout(self.name, out, ids)
        if x is None and tables.keys() & {"gain", "lora", "shift"}:
            raise RuntimeError(f"Mixed-batch routing: {self.name!r} was called without a positional input.")
        added = []
        if "gain" in tables:
            added.append(self._normalised(x).to(out.dtype) * _rows(tables["gain"], "delta", ids, out).to(out.dtype))
        if bias is not None:
            if bias.dim() != out.dim():
                bias = bias.view(bias.shape[0], *([1] * (out.dim() - 2)), bias.shape[-1])
            added.append(bias if bias.dtype == out.dtype else bias.to(out.dtype))
        if "lora" in tables:
            added.append(_lora(x, tables["lora"], ids).reshape(out.shape).to(out.dtype))
        if "shift" in tables:
            added.append(_shift(x, tables["shift"], ids).reshape(out.shape).to(out.dtype))
        for delta in added:
            out = out + delta  # not in place: an in-place operator takes the GIL again to return its tensor
        if "scale_out" in tables:
            out = (out * _rows(tables["scale_out"], "l", ids, out)).to(out.dtype)  # peft: (result * l).to(result)
        return out

    # ---- one adapter for every example (a bank's active task) -------------------------------------------------
    def change_input_one(self, x: torch.Tensor, adapter: str) -> torch.Tensor:
        part = self._part(adapter, "scale_in")
        if part is None:
            return x
        return (x.to(part[0].dtype) * part[0].flatten()).to(x.dtype)

    def change_output_one(self, x: torch.Tensor, out: torch.Tensor, adapter: str) -> torch.Tensor:
        """The adapter's change with the operations of the method's own layer (peft's LoRA and (IA)³ layers,
        AdapterBias's shift), in their order, so the output equals the adapter loaded alone bit for bit."""
        parts = self._adapters.get(adapter, {})
        dtype = out.dtype
        if ("gain", "") in parts:
            stock = self._stock("gain")
            gain = parts[("gain", "")][0].flatten()
            out = out + self._normalised(x) * (gain - (stock.flatten().to(gain) if stock is not None else 0))
        if ("bias", "") in parts:
            stock = self._stock("bias")
            bias = parts[("bias", "")][0].flatten()
            out = out + (bias - stock.flatten().to(bias) if stock is not None else bias).to(dtype)
        if ("lora", "A") in parts and ("lora", "B") in parts:
            a, b = parts[("lora", "A")][0], parts[("lora", "B")]
            out = (out + F.linear(F.linear(x.to(a.dtype), a), b[0]) * b[1]).to(dtype)  # peft: result + B(A(x)) * s
        if ("shift", "v") in parts and ("shift", "w") in parts:
            w = parts[("shift", "w")][0]
            c = parts.get(("shift", "c"))
            alpha = F.linear(x.to(w.dtype), w.reshape(1, -1), None if c is None else c[0].reshape(1).to(w.dtype))
            out = out + (alpha * parts[("shift", "v")][0].to(alpha.dtype)).to(dtype)  # AdapterBias: L_alpha(h) * v
        if ("scale_out", "") in parts:
            out = (out * parts[("scale_out", "")][0].flatten()).to(dtype)  # peft: (result * l).to(result)
        return out

    def _normalised(self, x: torch.Tensor) -> torch.Tensor:
        """The module's output with a unit gain and no bias: what its gain multiplies."""
        module = self.module
        if isinstance(module, nn.LayerNorm):
            return F.layer_norm(x, module.normalized_shape, None, None, module.eps)
        from torch.func import functional_call

        unit = {"weight": torch.ones_like(module.weight)}
        if isinstance(getattr(module, "bias", None), torch.Tensor):
            unit["bias"] = torch.zeros_like(module.bias)
        with _quiet(module):
            return functional_call(module, unit, (x,))


def _pick(table: Dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Each example's row number in a kind's compact tables."""
    return table["index"].index_select(0, ids.to(table["index"].device))


def _rows(table: Dict[str, torch.Tensor], key: str, ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Each example's row of ``table[key]``, shaped to broadcast over ``like`` (``[batch, ..., features]``)."""
    picked = table[key].index_select(0, _pick(table, ids))
    return picked.view(picked.shape[0], *([1] * (like.dim() - 2)), picked.shape[-1])


def _check_layout(name: str, out: torch.Tensor, ids: torch.Tensor) -> None:
    if out.dim() < 2 or out.shape[0] != ids.shape[0]:
        raise RuntimeError(f"Mixed-batch routing: the output of {name!r} has shape {tuple(out.shape)}, not "
                           f"[batch={ids.shape[0]}, ..., features]; this attention/packing layout is not supported.")


def _lora(x: torch.Tensor, table: Dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    rows = _pick(table, ids)
    A = table["A"].index_select(0, rows)  # noqa: N806 - [batch, r, in]
    B = table["B"].index_select(0, rows)  # noqa: N806 - [batch, out, r]
    flat = x.reshape(x.shape[0], -1, x.shape[-1]).to(A.dtype)
    return torch.bmm(torch.bmm(flat, A.transpose(1, 2)), B.transpose(1, 2))


def _shift(h: torch.Tensor, table: Dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    rows = _pick(table, ids)
    w, c, v = (table[k].index_select(0, rows) for k in ("w", "c", "v"))
    flat = h.reshape(h.shape[0], -1, h.shape[-1]).to(w.dtype)
    alpha = torch.bmm(flat, w.unsqueeze(-1)) + c.view(-1, 1, 1)  # [batch, tokens, 1]
    return alpha * v.unsqueeze(1).to(alpha.dtype)


_QUIET: set = set()  # modules whose routing hooks stand aside (a norm recomputed inside its own hook)


@contextlib.contextmanager
def _quiet(module: nn.Module) -> Iterator[None]:
    _QUIET.add(id(module))
    try:
        yield
    finally:
        _QUIET.discard(id(module))


class Router:
    """The :class:`LayerAdapters` of one model: adapters added by name with their stored tensors, and
    :meth:`route` around a forward pass that gives example ``i`` the adapter at index ``ids[i]``."""

    def __init__(self, model: nn.Module, stock: Callable[[str], Optional[torch.Tensor]]):
        self.model = model
        self.layers: Dict[str, LayerAdapters] = {}
        self._stock = stock  # a stock tensor by its (stock) name
        self._active: List[str] = []
        self._fused: Optional[List[Tuple[torch.Tensor, List[str], List[int]]]] = None

    def add(self, adapter: str, routed: Mapping[str, Tuple[Route, torch.Tensor]]) -> None:
        """``routed``: ``{stored name: (route, tensor)}``; a shared L_alpha (``Route.module == "*"``) goes to every
        module where the adapter has a shift vector."""
        self._fused = None
        modules = dict(self.model.named_modules())
        shared = [(r, t) for r, t in routed.values() if r.module == ANY_SHIFT]
        for route, tensor in routed.values():
            if route.module == ANY_SHIFT:
                continue
            layer = self.layers.get(route.module)
            if layer is None:
                layer = self.layers[route.module] = LayerAdapters(route.module, modules[route.module],
                                                                  self._stock_of(route.module))
                layer.set_active(self._active)
            layer.add(adapter, route, tensor)
            if route.kind == "shift" and route.slot == "v":
                for shared_route, shared_tensor in shared:
                    layer.add(adapter, Route(route.module, "shift", shared_route.slot), shared_tensor)

    def delete(self, adapter: str) -> None:
        self._fused = None
        for name in list(self.layers):
            self.layers[name].delete(adapter)
            if not self.layers[name].names:
                del self.layers[name]

    def set_active(self, adapters: Sequence[str]) -> None:
        self._active = list(adapters)
        self._fused = None
        for layer in self.layers.values():
            layer.set_active(self._active)

    def _stock_of(self, module: str) -> Callable[[str], Optional[torch.Tensor]]:
        return lambda kind: self._stock(f"{module}.{'weight' if kind == 'gain' else 'bias'}")

    def build(self) -> None:
        """Every table a routed forward pass reads, built now (else the first pass builds them)."""
        self.routed_layers()
        self._fused_bias()

    def routed_layers(self) -> Dict[str, LayerAdapters]:
        """The layers whose change is not nothing for the active adapters."""
        return {name: layer for name, layer in self.layers.items() if layer.kinds()}

    def hold(self, adapter: str) -> Callable[[], None]:
        """Route every example to ``adapter`` (a bank's active task) until the returned function is called."""
        handles = []
        for layer in self.layers.values():
            if adapter not in layer.names:
                continue
            if layer.has(adapter, "scale_in"):
                handles.append(layer.module.register_forward_pre_hook(_pre_hook(layer, adapter)))
            handles.append(layer.module.register_forward_hook(_post_hook(layer, adapter)))

        def release() -> None:
            for handle in handles:
                handle.remove()

        return release

    def _fused_bias(self) -> List[Tuple[torch.Tensor, List[str], List[int]]]:
        """Every layer's :meth:`LayerAdapters.bias_rows` side by side, one table per dtype and device:
        ``(table [active + 1, sum of features], layer names, their widths)``. A pass then picks each example's
        deltas for all layers with one gather instead of a few operators per layer, each of which hands the GIL
        back and forth with the server's other threads."""
        if self._fused is None:
            groups: Dict[Tuple[torch.dtype, torch.device], Tuple[List[torch.Tensor], List[str]]] = {}
            for name, layer in self.layers.items():
                rows = layer.bias_rows()
                if rows is not None:
                    tensors, names = groups.setdefault((rows.dtype, rows.device), ([], []))
                    tensors.append(rows)
                    names.append(name)
            self._fused = [(torch.cat(tensors, dim=1), names, [t.shape[1] for t in tensors])
                           for tensors, names in groups.values()]
        return self._fused

    def _picked_bias(self, ids: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each routed layer's bias delta per example, ``[batch, 1, features]`` views of one gather."""
        picked: Dict[str, torch.Tensor] = {}
        for table, names, widths in self._fused_bias():
            rows = table.index_select(0, ids.to(table.device)).unsqueeze(1)
            picked.update(zip(names, rows.split(widths, dim=2)))
        return picked

    @contextlib.contextmanager
    def route(self, ids: torch.Tensor, tokens: Optional[TokenRows] = None) -> Iterator[None]:
        """While open, a forward pass of the model changes example ``i`` with adapter ``ids[i]``; modules under
        ``tokens.under`` (a packed encoder) see tokens laid out as ``tokens.example_of`` says."""
        handles = []
        try:
            batch = ids.shape[0]
            if tokens is not None:  # one more index, the stock model's, for the pads of packed rows
                ids = torch.cat([ids, ids.new_full((1,), len(self._active))])
            picked = self._picked_bias(ids)
            token_ids = one_hot = None
            if tokens is not None:
                token_ids = ids.index_select(0, tokens.example_of.flatten().to(ids.device))
                one_hot = _one_hots(tokens.example_of, batch + 1)
            for name, layer in self.routed_layers().items():
                which, per_token, bias = ids[:batch], None, picked.get(name)
                if tokens is not None and is_under(name, [tokens.under]):
                    which, per_token = token_ids, tokens.example_of
                elif bias is not None:
                    bias = bias[:batch]
                if "scale_in" in layer.kinds():
                    handles.append(layer.module.register_forward_pre_hook(_pre_hook(layer, which, per_token)))
                handles.append(layer.module.register_forward_hook(_post_hook(layer, which, bias, per_token, one_hot)))
            yield
        finally:
            for handle in handles:
                handle.remove()


@dataclass(frozen=True)
class TokenRows:
    """A forward pass in which the modules under ``under`` see packed rows ``[rows, row_width, features]``:
    ``example_of[r, j]`` is the example at position ``j`` of row ``r``, or ``batch`` (the stock model) for a pad."""

    under: str
    example_of: torch.Tensor


def _one_hots(example_of: torch.Tensor, examples: int) -> Callable[[torch.dtype, torch.device], torch.Tensor]:
    """``[rows, row_width, examples]`` one-hot rows of each token's example, made once per pass for each dtype and
    device."""
    made: Dict[Tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def one_hot(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if (dtype, device) not in made:
            made[dtype, device] = F.one_hot(example_of.to(device), examples).to(dtype)
        return made[dtype, device]

    return one_hot


def _per_token(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``[rows, row_width, features]`` as ``[tokens, 1, features]``: one routed "example" per token."""
    return None if tensor is None else tensor.reshape(-1, 1, tensor.shape[-1])


def _pre_hook(layer: LayerAdapters, which: Union[torch.Tensor, str], per_token: Optional[torch.Tensor] = None):
    """``which``: per-example (or, with ``per_token``, per-token) indices, or one adapter's name."""
    change = layer.change_input_one if isinstance(which, str) else layer.change_input

    def hook(module, args):
        if id(module) in _QUIET:
            return None
        x = args[0]
        if per_token is not None:
            return (change(_per_token(x), which).view(x.shape), *args[1:])
        return (change(x, which), *args[1:])

    return hook


def _post_hook(layer: LayerAdapters, which: Union[torch.Tensor, str], bias: Optional[torch.Tensor] = None,
               per_token: Optional[torch.Tensor] = None, one_hots: Optional[Callable] = None):
    """``bias``: the examples' bias deltas for this layer, gathered before the pass (routed by index only);
    ``per_token``: the example of each token where the module sees packed rows, ``one_hots`` its one-hot rows."""
    if isinstance(which, str):
        change = layer.change_output_one
    elif per_token is None:
        def change(x, out, ids):
            return layer.change_output(x, out, ids, bias)
    else:
        # each token's bias delta as (one-hot of its example) @ (the examples' deltas), added by the same batched
        # matrix product, one operator: a row gather and an add cost more, and each operator of a pass waits for
        # the GIL again under a busy server
        deltas = one_hot = None
        if bias is not None:
            one_hot = one_hots(bias.dtype, bias.device)
            deltas = bias.transpose(0, 1).expand(one_hot.shape[0], *bias.shape[::2])  # [rows, examples, features]
        others = set(layer.kinds()) - {"bias", "scale_in"}

        def change(x, out, ids):
            if deltas is not None:
                out = torch.baddbmm(out, one_hot, deltas) if out.dtype == deltas.dtype else \
                    torch.baddbmm(out.to(deltas.dtype), one_hot, deltas).to(out.dtype)
            if not others:
                return out
            return layer.change_output(_per_token(x), _per_token(out), ids).view(out.shape)

    def hook(module, args, output):
        if id(module) in _QUIET:
            return output
        out = output[0] if isinstance(output, tuple) else output
        out = change(args[0] if args else None, out, which)
        return (out, *output[1:]) if isinstance(output, tuple) else out

    return hook
