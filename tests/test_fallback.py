"""The low-acceptance fallback gate (eagle_ms/fallback.py) against hand-computed decisions."""
import math

import pytest

from eagle_ms.fallback import SpeculationGate


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
                                                    ("2", 4, "fallback_accept"), (1.0, 0, "fallback_steps"),
                                                    (1.0, 1.5, "fallback_steps"), (1.0, True, "fallback_steps")])
def test_bad_settings_name_the_key(min_accept, steps, key):
    with pytest.raises(ValueError, match=f"speculative.{key}"):
        SpeculationGate(min_accept, steps)
