"""Trial job files tokenise in a data-loader worker (issue 39: the host tokenised 25-33k-token documents inside
every second timed step; docs/results/engines/torchtitan-moe-h200x1-2026-12-04/)."""

from __future__ import annotations

import tomllib

from autotune.engines.torchtitan import runner as tr
from autotune.engines.torchtitan.job import job_toml
from autotune.spec.models import get_builtin_model as get_model
from autotune.spec.plan import Plan, Workload

WL = Workload(seq_len=4096, global_batch_size=4)
PLAN = Plan(tp_degree=1, pp_degree=1, dp_degree=1, micro_batch_size=4, num_micro_batches=1, precision="bf16",
            zero_stage=0)


def test_default_job_has_no_dataloader_section():
    # torchtitan's default (num_workers 0) is left implicit: exported/other job files are unchanged
    t = tomllib.loads(job_toml(PLAN, get_model("8b"), WL, steps=4, layers=2, hf_assets_path="tok"))
    assert "dataloader" not in t["training"]


def test_data_workers_written_under_training_dataloader():
    # torchtitan 0.2.2 config/job_config.py: Training.dataloader is a DataLoader with num_workers
    for model in ("8b", "qwen3-30b-a3b"):
        t = tomllib.loads(job_toml(PLAN, get_model(model), WL, steps=4, layers=2, hf_assets_path="tok",
                                   data_workers=3))
        assert t["training"]["dataloader"] == {"num_workers": 3}
        assert t["training"]["seq_len"] == 4096        # the [training] table itself is intact


def test_trial_run_key_carries_one_worker():
    # the runner's key is the job text it launches (steps=1): it must hold the worker setting the trials use
    assert tr.DATA_WORKERS == 1
    key = tr.run_key(get_model("qwen3-30b-a3b"), WL, 2)(PLAN)
    assert "\n[training.dataloader]\nnum_workers = 1\n" in key
