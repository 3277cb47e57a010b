"""Workloads: what the sweep's requests ask for and when they are sent, beyond synthetic lengths.

Each workload turns the sweep settings into steps (`StepSpec`) and runs one step by calling
`send(prompt) -> record` per request; the sweep owns the clients, records and metrics, so every
workload produces the same records and exports. Kinds (sweep.workload.kind):

- synthetic: prompts of the sweep's lengths (bench/prompts.py), per load level and shape;
- dataset: a file of prompts a user brings (ShareGPT JSON, JSONL of {"text", "output_length"});
- trace: a Mooncake-format JSONL trace replayed on its recorded schedule (with a speed-up factor);
- shared_prefix: N system prompts shared by M users each, so prefix caching is measurable;
- multi_turn: conversations whose every turn re-sends the growing history, with think time;
- mixed: the sweep's short requests plus long prompts at a set rate (the noisy neighbour), by class.
"""

from toolkit.bench.workloads.base import StepSpec, Workload, make_workload

__all__ = ["StepSpec", "Workload", "make_workload"]
