"""The adaptive-depth policy (eagle_ms/depth_policy.py) against its hand-computed rule."""
from eagle_ms.depth_policy import DepthPolicy
from eagle_ms.drafting import TreeParams

SHALLOW = TreeParams(24, 10, 2).shallow(4)


def trees(policy, accepted):
    """The tree of every step, recording each step's A (None: a teacher-only step) after it."""
    out = []
    for a in accepted:
        out.append("shallow" if policy.tree() is SHALLOW else "full")
        policy.record(a)
    return out


def test_docstring_example():
    assert trees(DepthPolicy(SHALLOW), [9, 2, 1, 4, 6]) == ["full", "full", "shallow", "shallow", "full"]


def test_teacher_only_steps_keep_the_choice_and_off_means_full():
    assert trees(DepthPolicy(SHALLOW), [0, None, None, 3, 4, None, 0]) == [
        "full", "shallow", "shallow", "shallow", "shallow", "full", "full"]
    policy = DepthPolicy(None)
    assert trees(policy, [0, 0, 0]) == ["full"] * 3 and policy.tree() is None


def test_a_shallow_step_that_accepts_all_its_drafts_switches_back():
    assert trees(DepthPolicy(SHALLOW), [0, 4, 3, 10]) == ["full", "shallow", "full", "shallow"]
