"""Read a toolkit AIPerf export folder with aiperf's own models and loader (run with aiperf's python).

Usage: AIPERF_PYTHON validate_with_aiperf.py FOLDER  → prints a JSON line of what aiperf read.
"""

import json
import sys
from pathlib import Path

from aiperf.common.models import InputsFile, MetricRecordInfo
from aiperf.common.models.export_models import JsonExportData
from aiperf.plot.core.data_loader import DataLoader

folder = Path(sys.argv[1])
summary = JsonExportData.model_validate_json((folder / "profile_export_aiperf.json").read_text())
records = [MetricRecordInfo.model_validate_json(line)
           for line in (folder / "profile_export.jsonl").read_text().splitlines()]
if (folder / "inputs.json").exists():
    InputsFile.model_validate_json((folder / "inputs.json").read_text())
run = DataLoader().load_run(folder)  # what `aiperf plot` does with an artifact folder
print(json.dumps({"records": len(records), "phases": sorted({r.metadata.benchmark_phase.value for r in records}),
                  "ttft_p50": summary.time_to_first_token.p50 if summary.time_to_first_token else None, "loader_model": run.metadata.model,
                  "loader_concurrency": run.metadata.concurrency, "loader_requests": run.metadata.request_count}))
