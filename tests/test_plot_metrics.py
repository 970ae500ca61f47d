#!/usr/bin/env python3
"""scripts/plot_metrics.py: the accuracy axis zooms to the data (no matplotlib needed)."""
import importlib.util
import os
import sys

root = os.environ.get("CNN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("plot_metrics",
                                              os.path.join(root, "scripts", "plot_metrics.py"))
pm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pm)

lo, hi = pm.accuracy_limits([97.0, 98.5, None, 99.1])
assert 96.0 < lo < 97.0 and 99.1 < hi <= 100.0, (lo, hi)  # zoomed, not [0, 100]
assert pm.accuracy_limits([99.9, 100.0]) == (99.4, 100.0)  # clamped at 100
assert pm.accuracy_limits([0.0, 2.0])[0] == 0.0  # clamped at 0
assert pm.accuracy_limits([None]) is None
print("test_plot_metrics: ok")
sys.exit(0)
