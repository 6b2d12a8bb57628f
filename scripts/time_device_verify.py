"""Time the device verify step (VerifyStep: forward + accept + commit, one small int read) against today's
host path (runner.verify + host argmax + greedy_accept + commit_by_path), warm, alternated, medians.

    python scripts/time_device_verify.py --config configs/demo.yaml [--contexts 200,450,900,1900]
        [--repeats 30] [--commit-options] [--set key=value ...]

``--commit-options`` also times the commit alternatives of docs/architecture.md §"Device-resident step"
as VerifyStep variants on the same inputs: (0) no commit at all (the floor), (a) always move D+1 rows
(identity rows when in order; the shipped VerifyStep), (b) graph control flow on a tensor condition (skip
the move when every row is an identity copy). Prints one JSON object.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def commit_variants():
    """VerifyStep subclasses for options (0) and (b); defined here: they are measurements, not product code."""
    from mindspore import ops

    from eagle_ms.models.kv_cache import flat_rows
    from eagle_ms.models.verify_step import VerifyStep, commit_slots

    class NoCommit(VerifyStep):
        def commit(self, committed_len, accepted, node_ids):
            return None

    class BranchingCommit(VerifyStep):
        def commit(self, committed_len, accepted, node_ids):
            src, dst = commit_slots(committed_len, accepted, node_ids, self.capacity)
            moved = ops.logical_not(ops.equal(src, dst)).any()
            if moved:
                src_rows = flat_rows(src, self.num_kv_heads, self.capacity)
                dst_rows = flat_rows(dst, self.num_kv_heads, self.capacity)
                for cache in self.caches:
                    cache.move(src_rows, dst_rows)
            return moved

    return {"none": NoCommit, "always": VerifyStep, "branch": BranchingCommit}


def time_commit_options(runner, budget, max_depth, contexts, repeats):
    import numpy as np

    from eagle_ms.bench.verify_timing import probe_trees, time_cells
    from eagle_ms.device_verify import TreeInputs

    rng = np.random.default_rng(1)
    out = []
    for context in contexts:
        runner.prefill(rng.integers(0, runner.vocab_size, context).astype(np.int32))
        trees = probe_trees(runner, budget, max_depth, 7, rng)
        window = runner.attention_width(runner.length + budget + 1)
        cells = {name: cls(runner.model, max_depth, window) for name, cls in commit_variants().items()}
        inputs = {}
        for kind in ("in_order", "out_of_order"):
            x = TreeInputs.from_tree(trees[kind])
            inputs[kind] = (x.tokens, x.position_ids, x.tree_mask, x.paths, x.path_lengths,
                            ms_tensor([runner.length]))
        out.append({"context": context, "window": window, "N": budget + 1,
                    "median_ms": time_cells(cells, inputs, repeats)})
    return out


def ms_tensor(values):
    import numpy as np
    from mindspore import Tensor

    return Tensor(np.array(values, np.int32))


def main():
    from eagle_ms.bench.calls import add_timing_args, timing_runner

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timing_args(p)
    p.add_argument("--contexts", default="200,450,900,1900")
    p.add_argument("--commit-options", action="store_true")
    args = p.parse_args()
    from eagle_ms.bench.verify_timing import time_verify_paths
    from eagle_ms.device_verify import DeviceVerifier

    cfg, runner = timing_runner(args)
    contexts = [int(c) for c in args.contexts.split(",")]
    spec = cfg.speculative
    report = {"config": args.config, "overrides": args.set, "budget": spec.budget, "max_depth": spec.max_depth,
              "repeats": args.repeats, "shared_machine": True}
    if args.commit_options:
        report["commit_options"] = time_commit_options(runner, spec.budget, spec.max_depth, contexts, args.repeats)
    verifier = DeviceVerifier(runner, spec.max_depth)
    report["steps"] = time_verify_paths(runner, verifier, spec.budget, contexts, args.repeats)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
