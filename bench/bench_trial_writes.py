"""CPU per trial of a trial's storage writes, batched (autotune.study.trials.ParamBuffer / write_trial, as
`Tuner._objective` and `record_result` write) against Optuna's per-item calls (issue 26).

    python bench/bench_trial_writes.py              # 2 rounds x 60 trials each way, a fresh SQLite file each

Each trial samples 17 categorical parameters (the default space's knobs), stores a plan user attribute, 14
result user attributes and 2 constraint system attributes: what a simulated trial of `autotune run` writes.
"per-item" is the code before issue 26's fourth round (its 14 result attributes were already one
transaction, set_user_attrs). The study's own create / ask / tell are in both columns. CPU is this process's (``time.process_time``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

from autotune.study.trials import ParamBuffer, set_user_attrs, write_trial  # noqa: E402


def run(batched: bool, n: int = 60) -> float:
    """CPU ms per trial of ``n`` trials on a fresh SQLite study."""
    with tempfile.TemporaryDirectory() as d:
        study = optuna.create_study(storage=f"sqlite:///{d}/s.db")

        def objective(trial: optuna.Trial) -> float:
            attrs = {f"a{i}": [i, "x"] for i in range(14)}
            if batched:
                with ParamBuffer(trial) as written:
                    for i in range(17):
                        trial.suggest_categorical(f"k{i}", (1, 2, 3))
                    written.flush({"plan": {"x": 1}})
                write_trial(trial, user_attrs=attrs, system_attrs={"constraints:m": -1.0, "constraints": [-1.0]})
            else:
                for i in range(17):
                    trial.suggest_categorical(f"k{i}", (1, 2, 3))
                trial.set_user_attr("plan", {"x": 1})
                trial.set_constraint("m", -1.0)
                trial.storage.set_trial_system_attr(trial._trial_id, "constraints", [-1.0])
                set_user_attrs(trial, attrs)
            return 0.0

        c = time.process_time()
        study.optimize(objective, n_trials=n)
        return (time.process_time() - c) / n * 1e3


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = [(mode, run(mode == "batched")) for _ in range(2) for mode in ("per-item", "batched")]
    print(f"{'writes':10s} {'CPU ms / trial':>15s}")
    for mode, ms in rows:
        print(f"{mode:10s} {ms:15.1f}")


if __name__ == "__main__":
    main()
