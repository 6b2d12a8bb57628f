"""Does a graph call return before its kernels finish? The device step's draft graph, timed as called.

    python scripts/time_graph_return.py [--config configs/demo.yaml] [--data-dir ../shared/data] \
        [--context 300] [--calls 40]

From a real decoding state (a chat prompt of about ``--context`` tokens, 3 greedy device steps), times the
draft graph call until it returns, then the read of its first output right after, and the same read 10 ms
after another call. If MindSpore ran the graph asynchronously, the call would return early and the first
read would wait for the kernels; the stage timers of eagle_ms/device_step.py assume it does not. Prints
one JSON object of medians in ms.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import numpy as np
    from mindspore import Tensor

    from eagle_ms.bench.fused_step_timing import state_after_steps
    from eagle_ms.config import load_config
    from eagle_ms.config_yaml import parse_overrides
    from eagle_ms.demo import default_data_dir
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session
    from time_device_draft import prompts_of

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--calls", type=int, default=40)
    args = p.parse_args()
    cfg = load_config(args.config, parse_overrides(["speculative.step=device", "speculative.draft=eagle3",
                                                    "speculative.fallback_accept=0"]))
    setup_context(cfg)
    session = Session(cfg)
    session.warm_up()
    verifier, device_tree = session.verifier(session.settings.sampling), session.device_tree
    prompt = prompts_of(session, args.data_dir or default_data_dir(), args.context, 1)[0]
    result, aux, prev, length = state_after_steps(verifier, device_tree, prompt, 3)
    draft = device_tree.graph(verifier.runner.attention_width(length + device_tree.params.budget + 1))
    prev_t = Tensor(np.array([prev], np.int32))
    for _ in range(5):
        draft(result, aux, prev_t)[0].asnumpy()
    call, read, late_read = [], [], []
    for _ in range(args.calls):  # repeating the call is exact: it rewrites the same slots with the same values
        t0 = time.perf_counter()
        out = draft(result, aux, prev_t)
        t1 = time.perf_counter()
        out[0].asnumpy()
        call.append(t1 - t0)
        read.append(time.perf_counter() - t1)
        out = draft(result, aux, prev_t)
        time.sleep(0.01)
        t0 = time.perf_counter()
        out[0].asnumpy()
        late_read.append(time.perf_counter() - t0)
    verifier.runner.reset()
    print(json.dumps({"context": int(length), "calls": args.calls, "call_ms": float(np.median(call)) * 1e3,
                      "read_after_call_ms": float(np.median(read)) * 1e3,
                      "read_10ms_later_ms": float(np.median(late_read)) * 1e3}))


if __name__ == "__main__":
    main()
