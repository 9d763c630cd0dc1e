"""The kernel-level lever fields of Plan (issue 43): defaults, validation, YAML round trip, engines."""

from __future__ import annotations

import pytest
import yaml

from autotune.errors import PlanError
from autotune.spec.engines import check_plan_for_engine, get_engine
from autotune.spec.plan import LEVER_FIELDS, Plan

LEVERS = {"attention_backend": "flash", "compile_mode": "max-autotune-no-cudagraphs", "loss_impl": "chunked",
          "fp8_bf16_linears": "kv", "optimizer_impl": "foreach"}


def test_defaults_are_the_runtime_before_the_levers():
    p = Plan()
    assert (p.attention_backend, p.compile_mode, p.loss_impl, p.fp8_bf16_linears, p.optimizer_impl) == \
        ("default", "default", "full", "none", "fused")


def test_plan_without_lever_fields_loads_with_defaults():
    # a plan file written before the levers existed (no such keys) is the same plan as before
    d = Plan(tp_degree=2, precision="fp8_tensorwise").to_dict()
    for k in LEVER_FIELDS:
        d.pop(k)
    assert Plan.from_dict(d) == Plan(tp_degree=2, precision="fp8_tensorwise")


def test_lever_fields_round_trip_yaml():
    p = Plan(compile=True, **LEVERS)
    assert Plan.from_dict(yaml.safe_load(yaml.safe_dump(p.to_dict()))) == p


@pytest.mark.parametrize("field", sorted(LEVER_FIELDS))
def test_invalid_lever_value_is_refused(field):
    with pytest.raises(PlanError, match=field):
        Plan(**{field: "bogus"})


def test_engines_refuse_levers_they_do_not_have():
    native = get_engine("native")
    check_plan_for_engine(Plan(compile=True, **LEVERS), native)
    for name in ("megatron", "torchtitan"):
        with pytest.raises(PlanError, match="loss_impl=chunked cannot run on engine"):
            check_plan_for_engine(Plan(loss_impl="chunked"), get_engine(name))
        check_plan_for_engine(Plan(), get_engine(name))       # the defaults run everywhere
