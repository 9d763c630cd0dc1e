"""Where results live: Optuna storages, study identity, trial records and best plans.

* :mod:`autotune.study.storage`: opening a storage URL (SQLite, PostgreSQL, journal) with clear errors.
* :mod:`autotune.study.storage_check`: checks of storage files and URLs before Optuna touches them.
* :mod:`autotune.study.identity`: study names, :class:`StudyInfo`, listing, loading, fingerprint checks.
* :mod:`autotune.study.trials`: what a trial records, feasibility, the best plan, failure summaries.

Imports :mod:`autotune.search`, :mod:`autotune.cost`, :mod:`autotune.spec` and the bottom layer.
"""
