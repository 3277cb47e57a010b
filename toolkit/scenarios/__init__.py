"""`toolkit scenario NAME`: a production failure reproduced on a deployment and its fix proven by A/B.

Each scenario (catalog.py) is a workload that provokes one failure, a baseline and a fixed variant
of the same config, and the metric that shows it. run.py runs both through the A/B stage
(toolkit/ab/) and writes a report whose first sentence says what happened, backed by the A/B
interval and a figure (figures.py). Levers the served engine does not honour are named, not faked.
"""
