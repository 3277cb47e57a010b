"""`toolkit ab`: a stage beside the sweep that orchestrates sweeps of config variants (run.py) and judges
their differences (stats.py, pure)."""
