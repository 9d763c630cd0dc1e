"""Where a real trial's torchrun job runs: ``local`` (this host, :mod:`autotune.runtime.launch`) or
``slurm`` (a batch job on the cluster, :mod:`autotune.launchers.slurm`)."""

LAUNCHERS = ("local", "slurm")

__all__ = ["LAUNCHERS"]
