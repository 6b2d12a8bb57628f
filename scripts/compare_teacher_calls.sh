#!/usr/bin/env bash
# A/B warm teacher call times of two checkouts, runs alternated (A B A B ...), medians per N.
#
#   bash scripts/compare_teacher_calls.sh OLD_CHECKOUT NEW_CHECKOUT [ROUNDS] [-- time_teacher_calls.py args]
#
# Each round runs scripts/time_teacher_calls.py of OLD, then of NEW (each with its own package on
# PYTHONPATH), default --config configs/demo.yaml --sizes 1,17,33 --repeats 40. Prints every run's
# medians, then per N the median over rounds of each side and NEW/OLD. ROUNDS defaults to 3.
# Example: git worktree add /tmp/before <commit>; bash scripts/compare_teacher_calls.sh /tmp/before . 3
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
shift 2
rounds=3
if [[ $# -gt 0 && $1 != "--" ]]; then
  rounds=$1
  shift
fi
[[ $# -gt 0 && $1 == "--" ]] && shift
args=("$@")
[[ ${#args[@]} -eq 0 ]] && args=(--config configs/demo.yaml --sizes 1,17,33 --repeats 40)
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)
for tree in "$old" "$new"; do
  [[ -f $tree/scripts/time_teacher_calls.py ]] || { echo "not a checkout: $tree" >&2; exit 2; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for side in old new; do
    tree=$old
    [[ $side == new ]] && tree=$new
    line=$(cd "$tree" && GLOG_v=3 PYTHONPATH=$tree "$python" scripts/time_teacher_calls.py "${args[@]}" | tail -1)
    echo "$side $line" >>"$out"
    echo "round $r $side: $(echo "$line" | "$python" -c 'import json,sys; d=json.load(sys.stdin); print({n: round(c["median_ms"], 2) for n, c in d["calls"].items()})')"
  done
done
"$python" - "$out" <<'EOF'
import json, sys
import numpy as np
runs = {"old": [], "new": []}
for line in open(sys.argv[1]):
    side, payload = line.split(" ", 1)
    runs[side].append(json.loads(payload)["calls"])
for n in runs["old"][0]:
    old = float(np.median([r[n]["median_ms"] for r in runs["old"]]))
    new = float(np.median([r[n]["median_ms"] for r in runs["new"]]))
    print(f"N={n}: old {old:.2f} ms, new {new:.2f} ms, new/old {new / old:.3f}")
EOF
