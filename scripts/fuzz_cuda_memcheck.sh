#!/usr/bin/env bash
# Run the fuzz mutants that load, on cuda, under `compute-sanitizer --tool memcheck`.
#
#   scripts/fuzz_cuda_memcheck.sh [MUTANTS] [MASTER] [BATCH]     (defaults 2000 1 50)
#
# On the GPU machine (device tool, `.whl` in carry):
#   source scripts/device_env.sh || exit 1; scripts/fuzz_cuda_memcheck.sh 2000
#
# Step 1 (no sanitizer) writes every mutant that Program.loads accepts to a folder. Step 2
# runs them in batches, one python process per batch under memcheck, each mutant loaded on
# cuda and run on fresh random inputs and compared with the numpy reference. Logs and counts
# go under $OUT when it is set (else /tmp/aotrt-fuzz-memcheck): memcheck-<batch>.log,
# results.jsonl (one line per mutant) and counts.json (outcomes, memcheck error total,
# batches that crashed). ran_different on cuda may be FMA contraction or cuda libm in
# values the reference takes as exact: read the details. Exit status 1 when memcheck
# reported anything or a batch crashed.
set -u
MUTANTS="${1:-2000}"
MASTER="${2:-1}"
BATCH="${3:-50}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${OUT:-/tmp/aotrt-fuzz-memcheck}"
mkdir -p "$DEST/programs"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
CS="$(command -v compute-sanitizer ||
    ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -z "$CS" ]; then
    echo "fuzz_cuda_memcheck: compute-sanitizer not found" | tee "$DEST/counts.json"
    exit 2
fi

"$PY" - "$MUTANTS" "$MASTER" "$DEST/programs" <<'EOF' || exit 2
import sys
from pathlib import Path
import aotrt
from tests.fuzz import mutate as M
n, master, dest = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
files = M.seed_files()
kept = 0
for i in range(n):
    data = M.mutant(files, i, master)[2]
    try:
        aotrt.Program.loads(data)
    except aotrt.AotrtError:
        continue
    except Exception as e:  # a raw exception is the cpu fuzz run's finding; skip it here
        print(f"mutant {i}: {type(e).__name__}: {e}"[:200])
        continue
    (dest / f"{i:07d}.aotp").write_bytes(data)
    kept += 1
print(f"{kept} of {n} mutants load")
EOF

: > "$DEST/results.jsonl"
ls "$DEST/programs" | split -l "$BATCH" - "$DEST/batch-"
crashed=0
for b in "$DEST"/batch-*; do
    name="$(basename "$b")"
    "$CS" --tool memcheck --log-file "$DEST/memcheck-$name.log" --print-limit 200 \
        --error-exitcode 3 "$PY" - "$DEST/programs" "$b" >> "$DEST/results.jsonl" \
        2> "$DEST/stderr-$name.log" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np
import aotrt
from tests.fuzz import harness as H, reference as R
folder, listing = Path(sys.argv[1]), Path(sys.argv[2])
for fname in listing.read_text().split():
    i = int(fname.split(".")[0])
    res = {"id": i}
    try:
        prog = aotrt.Program.loads((folder / fname).read_bytes())
        xs = H.make_inputs(prog, i)
        if xs is None:
            res["outcome"] = "loaded_not_run"
        else:
            with aotrt.load(prog, device="cuda") as m:
                got = [np.array(np.asarray(o)) for o in m.run(*xs)]
            try:
                diff = R.compare(R.Reference(prog).run(xs), got)
                res["outcome"] = "ran_different" if diff else "ran_equal"
                res["detail"] = diff
            except R.RefRefusal as e:
                # cuda integer division by zero gives a defined value and no error (C2)
                kind = "ran_div0_defined" if "by zero" in str(e) else "ran_different"
                res.update(outcome=kind, detail=f"reference refuses: {e}")
            except R.RefUnchecked:
                res["outcome"] = "ran_unchecked"
    except aotrt.AotrtError as e:
        res.update(outcome="refused", detail=str(e)[:200])
    except Exception as e:
        res.update(outcome="raw_exception", detail=f"{type(e).__name__}: {e}"[:300])
    print(json.dumps(res), flush=True)
EOF
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
        crashed=$((crashed + 1))
        echo "batch $name exited $rc" >&2
    fi
done

"$PY" - "$DEST" "$crashed" <<'EOF'
import collections, glob, json, re, sys
dest, crashed = sys.argv[1], int(sys.argv[2])
counts = collections.Counter()
for line in open(f"{dest}/results.jsonl"):
    try:
        counts[json.loads(line)["outcome"]] += 1
    except ValueError:
        pass
errors = 0
for log in glob.glob(f"{dest}/memcheck-*.log"):
    for m in re.finditer(r"ERROR SUMMARY: (\d+) error", open(log, errors="replace").read()):
        errors += int(m.group(1))
out = {"outcomes": dict(counts), "memcheck_errors": errors, "crashed_batches": crashed}
json.dump(out, open(f"{dest}/counts.json", "w"), indent=1)
print(json.dumps(out))
sys.exit(1 if errors or crashed else 0)
EOF
