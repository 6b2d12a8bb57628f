"""The low-acceptance fallback gate (eagle_ms/fallback.py) against hand-computed decisions."""
import math

import pytest

from eagle_ms.fallback import SpeculationGate, StepCosts


def decisions(gate, accepts):
    """Drive the gate: at each step draft (consume the next accept_L) or take a teacher-only step.
    Returns the step kinds, 'D' (drafted) / 'T' (teacher-only), and the averages after drafted steps."""
    kinds, averages, todo = [], [], list(accepts)
    while todo:
        if gate.speculate():
            gate.record(todo.pop(0))
            kinds.append("D")
            averages.append(gate.average)
        else:
            gate.record(None)
            kinds.append("T")
    return "".join(kinds), averages


def test_module_doc_worked_example():
    # min_accept 2, 3 teacher-only steps: A = 1 -> avg 1 (< 2, fall back); probe A = 6 -> avg 3.5;
    # A = 0 -> avg 1.75 (< 2, fall back); probe A = 4 -> avg 2.875
    kinds, averages = decisions(SpeculationGate(2.0, 3), [1, 6, 0, 4])
    assert kinds == "DTTTDDTTTD"
    assert averages == pytest.approx([1.0, 3.5, 1.75, 2.875])


def test_zero_threshold_never_falls_back():
    kinds, _ = decisions(SpeculationGate(0.0, 5), [0] * 20)
    assert kinds == "D" * 20


def test_hopeless_draft_probes_once_per_period():
    kinds, _ = decisions(SpeculationGate(math.inf, 4), [9, 9, 9])
    assert kinds == "DTTTT" "DTTTT" "D"


def test_recovers_after_good_probes():
    # min_accept 3, 1 teacher-only step: A 0 -> avg 0 (T); 8 -> 4; 8 -> 6; 2 -> 4; 0 -> 2 (T); 0 -> 1 (end)
    kinds, _ = decisions(SpeculationGate(3.0, 1), [0, 8, 8, 2, 0, 0])
    assert kinds == "DT" "D" "D" "D" "DT" "D"


@pytest.mark.parametrize("min_accept, steps, key", [(-0.5, 4, "fallback_accept"), (float("nan"), 4, "fallback_accept"),
                                                    ("2", 4, "fallback_accept"), ("Auto", 4, "fallback_accept"),
                                                    (1.0, 0, "fallback_steps"),
                                                    (1.0, 1.5, "fallback_steps"), (1.0, True, "fallback_steps")])
def test_bad_settings_name_the_key(min_accept, steps, key):
    with pytest.raises(ValueError, match=f"speculative.{key}"):
        SpeculationGate(min_accept, steps)


# ------------------------------------------------------------------------------ the measured bar ("auto")

def costs_of(*steps):
    """A StepCosts fed (drafted, seconds) steps in order."""
    costs = StepCosts()
    for drafted, seconds in steps:
        costs.record(drafted, seconds)
    return costs


def test_step_costs_moving_averages_by_hand():
    costs = costs_of((True, 0.030))
    assert costs.break_even is None  # no teacher-only step seen yet
    costs.record(False, 0.010)
    assert costs.break_even == pytest.approx(0.030 / 0.010 - 1)  # 2.0
    costs.record(True, 0.050)  # 0.1 * 0.050 + 0.9 * 0.030 = 0.032
    costs.record(False, 0.020)  # 0.1 * 0.020 + 0.9 * 0.010 = 0.011
    assert (costs.seconds["speculative"], costs.seconds["decode"]) == pytest.approx((0.032, 0.011))
    assert costs.break_even == pytest.approx(0.032 / 0.011 - 1)
    assert costs.counts == {"speculative": 2, "decode": 2}


def test_break_even_is_never_negative():
    assert costs_of((True, 0.005), (False, 0.010)).break_even == 0.0


def test_auto_gate_uses_the_measured_bar():
    # t_spec / t_dec = 4 -> bar 3: the doc example's accepts then fall back where a fixed 3.0 would
    costs = costs_of((True, 0.040), (False, 0.010))
    auto_kinds, _ = decisions(SpeculationGate("auto", 1, costs), [0, 8, 8, 2, 0, 0])
    fixed_kinds, _ = decisions(SpeculationGate(3.0, 1), [0, 8, 8, 2, 0, 0])
    assert auto_kinds == fixed_kinds == "DT" "D" "D" "D" "DT" "D"


def test_auto_gate_drafts_while_the_costs_are_unknown():
    gate = SpeculationGate("auto", 4, StepCosts())
    kinds, _ = decisions(gate, [0] * 6)
    assert kinds == "D" * 6 and gate.min_accept == 0.0


def test_auto_gate_needs_costs():
    with pytest.raises(ValueError, match="speculative.fallback_accept"):
        SpeculationGate("auto", 4)
