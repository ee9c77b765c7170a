"""The training-cost tables: rows aggregated from the workers' measurements, their correctness checks, the markdown
table and the target lines. Reads results files of every version (rows keyed by the benchmark's old names too)."""

from __future__ import annotations

import statistics
from typing import Dict, List

from cost_methods import canonical, label, parse_row
from cost_models import MODELS


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(speed: dict, memory: Dict[str, List[dict]], warmup: int) -> Dict[str, dict]:
    rows = {}
    times = speed["times"]
    base = "full" if "full" in speed["methods"] else None
    for method in speed["methods"]:
        steps = times.get(method, [])[warmup:]
        row = {"method": method, "measured_steps": len(steps)}
        if steps:
            med = statistics.median(steps)
            row["step_seconds"] = med
            row["samples_per_s"] = speed["batch"] / med
            row["step_seconds_all"] = [round(s, 4) for s in steps]
        if base and steps and times.get(base) and method != base:
            full = times[base][warmup:]
            pairs = [f / m for f, m in zip(full, steps)]
            row["speed_vs_full"] = statistics.median(pairs) if pairs else None
        elif method == base and steps:
            row["speed_vs_full"] = 1.0
        cpu = speed.get("cpu_times", {})
        if base and cpu.get(method) and cpu.get(base):
            # process CPU seconds per step (all threads): less sensitive to waiting for a core, more to spinning
            row["cpu_seconds_per_step"] = statistics.median(cpu[method][warmup:])
            row["cpu_speed_vs_full"] = statistics.median(
                [f / m for f, m in zip(cpu[base][warmup:], cpu[method][warmup:])])
        mems = memory.get(method, [])
        if mems:
            row["peak_bytes"] = _median([m["peak_bytes"] for m in mems])
            row["peak_bytes_all"] = [m["peak_bytes"] for m in mems]
            row["train_peak_above_loaded_bytes"] = _median([m["train_peak_above_loaded_bytes"] for m in mems])
            for key in ("trainable_params", "total_params", "optimizer_state_bytes", "adapter_bytes", "optim",
                        "optimizer_impl", "memory_measure", "device", "precision", "mixed_precision"):
                row[key] = mems[0][key]
            row["checks"] = all(_check(m) == [] for m in mems)
            row["check_failures"] = sorted({f for m in mems for f in _check(m)})
        rows[method] = row
    if base and base in rows and rows[base].get("peak_bytes"):
        for row in rows.values():
            if row.get("peak_bytes"):
                row["memory_vs_full"] = row["peak_bytes"] / rows[base]["peak_bytes"]
    return rows


def _check(m: dict) -> List[str]:
    """Correctness of one memory run: the list of failures (empty: fine)."""
    failures = []
    if not m["loss_finite"]:
        failures.append("loss not finite")
    if m["n_frozen_changed"]:
        failures.append(f"frozen tensors changed: {m['frozen_changed']}")
    if m["n_trained_changed"] == 0:
        failures.append("no trainable tensor changed")
    if "full" not in m["method"] and m["trainable_params"] >= m["total_params"]:
        failures.append("everything is trainable")
    if _frozen_bf16(m["method"]) and not m.get("frozen_bf16_tensors"):
        failures.append("no frozen tensor stored in bf16")
    if m.get("trained_not_float32"):
        failures.append(f"trained tensors not float32: {m['trained_not_float32'][:3]}")
    return failures


def _frozen_bf16(name: str) -> bool:
    try:
        return parse_row(name).frozen_dtype is not None
    except ValueError:
        return False


def _mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f} MB"


def _size(x) -> str:
    if x is None or x < 0:
        return "-"
    if x >= 2**20:
        return f"{x / 2**20:,.1f} MB"
    return f"{x / 2**10:,.1f} KB"


def markdown_table(model_name: str, rows: Dict[str, dict], batch: int, seq: int, placement: str = "CPU, fp32") -> str:
    gpu = placement.startswith("GPU") or any(row.get("device") == "cuda" for row in rows.values())
    lines = [
        f"**{MODELS[model_name]}**, batch {batch}, sequence {seq}, {placement}",
        "",
        f"| configuration | trainable params | samples/s | speed vs full | {'peak GPU memory' if gpu else 'peak RSS'} "
        "| vs full | training peak above loaded model | optimizer state | adapter / checkpoint file |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, row in rows.items():
        trainable = row.get("trainable_params")
        total = row.get("total_params")
        tp = "-" if trainable is None else f"{trainable:,} ({100 * trainable / total:.3g}%)"
        sps = row.get("samples_per_s")
        speed = "-" if row.get("speed_vs_full") is None else f"{row['speed_vs_full']:.2f}x"
        mem = "-" if row.get("memory_vs_full") is None else f"{row['memory_vs_full']:.2f}x"
        lines.append(
            f"| {label(method)} | {tp} | {'-' if sps is None else f'{sps:.2f}'} | "
            f"{speed} | "
            f"{_mb(row.get('peak_bytes'))} | "
            f"{mem} | "
            f"{_mb(row.get('train_peak_above_loaded_bytes'))} | {_size(row.get('optimizer_state_bytes'))} | "
            f"{_size(row.get('adapter_bytes'))} |"
        )
    return "\n".join(lines)


TARGETS = {  # model -> (min speed vs full, max memory vs full); set for the 2-core CPU
    "minilm": (1.40, 0.85),
    "bert-base": (1.40, 0.65),
}


def target_lines(model_name: str, rows: Dict[str, dict], device: str = "cpu") -> List[str]:
    rows = {canonical(name): row for name, row in rows.items()}
    if model_name not in TARGETS or "bitfit" not in rows or device != "cpu":
        return []
    speed_min, mem_max = TARGETS[model_name]
    b = rows["bitfit"]
    out = []
    if b.get("speed_vs_full") is not None:
        ok = b["speed_vs_full"] >= speed_min
        cpu = f" (by process CPU time: {b['cpu_speed_vs_full']:.2f}x)" if b.get("cpu_speed_vs_full") else ""
        out.append(f"- BitFit `all` speed vs full: {b['speed_vs_full']:.2f}x{cpu} (target >= {speed_min:.2f}x): "
                   f"{'met' if ok else 'NOT met'}")
    if "lora" in rows and rows["lora"].get("speed_vs_full") and b.get("speed_vs_full"):
        ratio = b["speed_vs_full"] / rows["lora"]["speed_vs_full"]
        out.append(f"- BitFit `all` vs LoRA r=8 speed: {ratio:.2f}x (target >= 1.00x): {'met' if ratio >= 1.0 else 'NOT met'}")
    both = rows.get("bitfit_lora", {}), rows.get("lora", {})
    if both[0].get("speed_vs_full") and both[1].get("speed_vs_full"):
        out.append(f"- BitFit `all` + LoRA vs LoRA alone: speed {both[0]['speed_vs_full'] / both[1]['speed_vs_full']:.2f}x"
                   + (f", peak memory {both[0]['peak_bytes'] / both[1]['peak_bytes']:.2f}x"
                      if both[0].get("peak_bytes") and both[1].get("peak_bytes") else "") + " (no target)")
    if b.get("memory_vs_full") is not None:
        ok = b["memory_vs_full"] <= mem_max
        out.append(f"- BitFit `all` peak memory vs full: {b['memory_vs_full']:.2f}x (target <= {mem_max:.2f}x): {'met' if ok else 'NOT met'}")
    return out
