"""Real trials through torchtitan's own trainer: ``--backend real --engine torchtitan`` (issue 23).

Lifecycle and failure isolation: :class:`autotune.runners.engine_runner.EngineRunner` (construct: checks
that torchtitan 0.2.x is importable and the GPUs are there, nothing starts; ``evaluate`` per plan;
``close`` removes the temp folder). What is torchtitan's here:

* the launch: the plan as a torchtitan 0.2.x job file (:func:`autotune.engines.torchtitan.job.job_toml`),
  with once per evaluator the synthetic tokenizer and dataset (:func:`autotune.runners.assets.write_assets`;
  nothing is downloaded) and one data-loader worker (:data:`DATA_WORKERS`: tokenisation off the timed step),
  run as ``-m torchtitan.train --job.config_file F``;
* the log (:mod:`autotune.engines.torchtitan.log`): the step time of each step from torchtitan's per-step
  ``tps`` (tokens one rank consumes per step / (tps x the non-data-parallel size)), peak memory =
  torchtitan's peak *reserved* bytes (rank 0), its own MFU (PaLM convention) kept beside autotune's.

torchtitan version: the job files are torchtitan 0.2.x TOML (:mod:`autotune.engines.torchtitan.job`
says why: 0.3.0 does not import under torch 2.11). A missing torchtitan is one error naming
``pip install -e '.[torchtitan-runner]' (in the autotune checkout)``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable

from autotune.cost.evaluator import StepResult
from autotune.errors import AutotuneError
from autotune.runners.engine_runner import (REFUSAL_EXCEPTIONS, EngineRunner, Launch, ParsedRun, classify_run,
                                            no_gpu_note, run_job)
from autotune.engines.torchtitan.job import TORCHTITAN_VERSION, job_toml
from autotune.engines.torchtitan.log import parse_facts, parse_steps
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

ENGINE = "torchtitan"
INSTALL_HINT = "pip install -e '.[torchtitan-runner]' (in the autotune checkout)"


def check_torchtitan() -> str:
    """The installed torchtitan version; raises AutotuneError when it is missing or not a 0.2.x release."""
    from importlib import metadata, util

    if util.find_spec("torchtitan") is None:
        raise AutotuneError(f"--engine torchtitan needs torchtitan, which is not installed: {INSTALL_HINT}"
                            + no_gpu_note())
    try:
        v = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        v = "unknown"
    if not v.startswith("0.2."):
        raise AutotuneError(f"torchtitan {v} is installed; the torchtitan runner writes 0.2.x job files (the "
                            f"releases that run on torch 2.11): pip install 'torchtitan=={TORCHTITAN_VERSION}'"
                            + no_gpu_note())
    return v


def check_engine() -> str:
    """The check the CLI runs before screening (:func:`check_torchtitan`)."""
    return check_torchtitan()


def run_key(model: ModelSpec, workload: Workload, layers: int | None,
            force_load_balance: bool = True) -> Callable[[Plan], str]:
    """The run key of a torchtitan plan: its job file and environment (raises ConfigError if unwritable)."""
    from autotune.engines.torchtitan.job import train_env

    def key(plan: Plan) -> str:
        return job_toml(plan, model, workload, steps=1, layers=layers, hf_assets_path="-",
                        force_load_balance=force_load_balance, data_workers=DATA_WORKERS) + repr(train_env(plan))

    return key


def classify(text: str, *, returncode: int | None, timed_out: bool, timeout_s: float, total_steps: int) -> dict:
    """:func:`autotune.runners.engine_runner.classify_run` of a torchtitan log, with its parsed ``records``
    (:func:`autotune.engines.torchtitan.log.parse_steps`) and ``facts``."""
    records, facts = parse_steps(text), parse_facts(text)
    c = classify_run(text, engine=ENGINE, steps_logged=[r.step for r in records],
                     memory_gib=[r.memory_gib for r in records], returncode=returncode, timed_out=timed_out,
                     timeout_s=timeout_s, total_steps=total_steps)
    return {**c, "records": records, "facts": facts}


#: synthetic documents for MoE runs: about 1.1 tokens a word with the 8,194-entry tokenizer, so a document
#: (22K-33K tokens) outlasts several 4,096-token sequences and DeepSeek 16B's flex ``block_causal`` mask (one
#: block per document: torchtitan v0.2.2 torchtitan/models/attention.py ``get_document_mask_mod``) is the
#: causal mask the cost model prices in all but ~1 sequence in 7 (which holds one document boundary)
MOE_DOCS, MOE_WORDS_PER_DOC = 60, (20000, 30000)

#: data-loader worker processes of every trial (``[training.dataloader] num_workers``:
#: :func:`autotune.engines.torchtitan.job.job_sections` ``data_workers``). With torchtitan's default 0 the train
#: loop tokenises a document when it starts one, inside the timed step (torchtitan v0.2.2
#: hf_datasets/text_datasets.py ``HuggingFaceTextDataset.__iter__``): with the MoE documents above that was
#: 55-97 ms of host time on every second step (docs/results/engines/torchtitan-moe-profile-h200x1-2026-12-03/,
#: point 1), a cost of the test data that no plan term prices. One worker tokenises ahead (2 batches queued,
#: torchdata ``StatefulDataLoader``'s default ``prefetch_factor``), overlapped with the GPU's step; the train
#: loop only dequeues a batch. Set before the 2026-12-04 re-measurement (issue 39); dense trials get it too.
DATA_WORKERS = 1


class TorchtitanEvaluator(EngineRunner):
    """Runs each plan with torchtitan's trainer on this host's GPUs (arguments: :class:`EngineRunner`;
    ``layers`` runs the depth-truncated flavour ``<flavour>_L<layers>``).

    ``force_load_balance`` (MoE models; default True): torchtitan's ``debug.moe_force_load_balance``, every
    expert the same number of tokens (the balanced routing the simulator assumes); False runs the router as
    initialised and trained. Each trial's details record which (``moe_routing``)."""

    ENGINE = ENGINE

    def __init__(self, *, force_load_balance: bool = True, **kw) -> None:
        super().__init__(**kw)
        self.torchtitan_version = self.engine_version
        self.force_load_balance = bool(force_load_balance)
        self._assets: tuple[Path, Path] | None = None

    def check_engine(self) -> str:
        return check_torchtitan()

    def assets(self) -> tuple[Path, Path]:
        """(tokenizer folder, dataset folder), written once into this evaluator's temp folder."""
        if self._assets is None:
            from autotune.runners.assets import write_assets

            if self.model.is_moe:
                self._assets = write_assets(self._tmpdir() / "assets", n_docs=MOE_DOCS,
                                             words_per_doc=MOE_WORDS_PER_DOC)
            else:
                self._assets = write_assets(self._tmpdir() / "assets")
        return self._assets

    def trainer_env(self, plan: Plan) -> dict[str, str]:
        """The trainer's environment: :meth:`EngineRunner.base_env`, the plan's allocator setting, offline
        Hugging Face libraries, and this checkout first on ``PYTHONPATH`` (for ``experimental.custom_import``)."""
        e = self.base_env()
        e.update(self._launch_env(plan))
        return e

    def _launch_env(self, plan: Plan) -> dict[str, str]:
        import os

        from autotune.engines.torchtitan.job import train_env

        e = dict(train_env(plan))
        e.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        root = str(Path(__file__).resolve().parents[2])
        cur = {**os.environ, **self.env}.get("PYTHONPATH")
        e["PYTHONPATH"] = root + (os.pathsep + cur if cur else "")
        return e

    def build(self, plan: Plan, workdir: Path, total_steps: int) -> Launch:
        tok, data = self.assets()
        text = job_toml(plan, self.model, self.workload, steps=total_steps, layers=self.layers,
                        hf_assets_path=str(tok), dataset_path=str(data), dump_folder=str(workdir / "outputs"),
                        warmup_steps=max(1, min(2, total_steps - 1)), force_load_balance=self.force_load_balance,
                        data_workers=DATA_WORKERS)
        facts = {"moe_routing": "balanced" if self.force_load_balance else "trained"} if self.model.is_moe else {}
        return Launch(entry=["-m", "torchtitan.train", "--job.config_file", str(workdir / "job.toml")],
                      env=self._launch_env(plan), job_text=text, job_suffix="toml", facts=facts)

    def parse(self, text: str, plan: Plan) -> ParsedRun:
        # tokens one rank consumes per step, and torchtitan's tps divisor (train.py: non-data-parallel size)
        tokens = plan.micro_batch_size * plan.num_micro_batches * self.workload.seq_len
        non_dp = plan.tp_degree * plan.pp_degree * plan.cp_degree
        recs, facts = parse_steps(text), parse_facts(text)
        if "torchtitan_version" in facts:
            facts["engine_version"] = facts["torchtitan_version"]
        return ParsedRun(steps=[r.step for r in recs], step_times_ms=[1e3 * r.step_time_s(tokens, non_dp) for r in recs],
                         losses=[r.loss for r in recs],
                         peak_reserved_bytes=[int(max(r.memory_gib for r in recs) * 2**30)] if recs else [],
                         facts=facts, per_step={"torchtitan_mfu_pct_per_step": [r.mfu_pct for r in recs]})

    def result(self, plan, model, c, parsed, run, *, warnings, kept_log, launch) -> StepResult:
        r = super().result(plan, model, c, parsed, run, warnings=warnings, kept_log=kept_log, launch=launch)
        d = r.details
        d["torchtitan_version"] = d.get("engine_version")
        d["job_toml"] = d.pop("job", launch.job_text)
        mfus = d.pop("torchtitan_mfu_pct_per_step", None)
        if mfus is not None:
            timed = mfus[self.warmup:]
            d["torchtitan_mfu_pct"] = statistics.median(timed) if timed and all(x is not None for x in timed) else None
            d["torchtitan_facts"] = {k: v for k, v in d.pop("engine_facts", {}).items()
                                     if k not in ("device", "engine_version")}
        return r

    def close(self) -> None:
        super().close()
        self._assets = None


__all__ = ["ENGINE", "INSTALL_HINT", "REFUSAL_EXCEPTIONS", "TorchtitanEvaluator", "check_engine", "check_torchtitan",
           "classify", "run_job", "run_key"]
