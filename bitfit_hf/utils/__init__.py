"""Leaf helpers every layer may use: atomic writes, ZeRO-3 gathering, shared names, recipe runs per cell."""
