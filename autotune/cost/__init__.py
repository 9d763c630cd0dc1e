"""What a plan costs: FLOPs, memory, op times, the step graph and its simulation.

* :mod:`autotune.cost.flops`: model FLOPs per token (MFU / HFU conventions).
* :mod:`autotune.cost.memory`: memory per pipeline stage (weights, gradients, optimizer, activations).
* :mod:`autotune.cost.schedule`: pipeline schedules (GPipe, 1F1B, interleaved 1F1B) and in-flight counts.
* :mod:`autotune.cost.topology`: where a parallel group's ranks sit (which link tier a collective uses).
* :mod:`autotune.cost.calibration`: calibration profiles (measured kernel and collective curves, YAML).
* :mod:`autotune.cost.op_costs`: op costs from a profile (:class:`OpCosts`, :class:`CalibratedCosts`).
* :mod:`autotune.cost.chunk_costs`: what one model chunk costs on one rank (:class:`CostBuilder`).
* :mod:`autotune.cost.graph`: one training step as a networkx dependency graph.
* :mod:`autotune.cost.simulator`: :class:`SimulatedEvaluator`, the graph's critical path.
* :mod:`autotune.cost.evaluator`: the :class:`Evaluator` interface, :class:`StepResult` and the backends.

Imports :mod:`autotune.spec` and the bottom layer only.
"""
