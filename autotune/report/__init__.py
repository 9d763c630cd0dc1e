"""Presenting results: text tables and JSON entries (:mod:`autotune.report.summary`), plots
(:mod:`autotune.report.plots`) and the simulated step as a Chrome trace / Gantt chart
(:mod:`autotune.report.trace`)."""
