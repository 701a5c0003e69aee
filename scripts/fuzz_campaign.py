"""The long fuzz campaign: N mutants of the seed programs, in chunks, resumable.

    .venv/bin/python scripts/fuzz_campaign.py --mutants 100000 [--sanitize] [--workers 2]

Each chunk's counts land in a state file (bench/results/fuzz/fuzz-state-<tag>.json); a rerun with
the same tag skips the chunks already done. At the end (and after every chunk) the results
table goes to bench/results/fuzz/fuzz-<date>.md and .json, with every bad outcome's mutant id,
seed program, mutation kinds and detail (mutant ids replay with tests.fuzz.mutate.mutant).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz import harness as H  # noqa: E402
from tests.fuzz import mutate as M  # noqa: E402


def main() -> int:
    """Run the campaign; exit status 1 when any bad outcome was seen."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=2_000)
    ap.add_argument("--master", type=int, default=1, help="master seed of the mutant stream")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant")
    ap.add_argument("--sanitize", action="store_true", help="ASan+UBSan kernels (C5)")
    ap.add_argument("--tag", default=None, help="state name (default: master and sanitize)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fuzz"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or f"m{args.master}{'-san' if args.sanitize else ''}"
    state_path = out / f"fuzz-state-{tag}.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {
        "chunks": {}, "bad": [], "seconds": 0.0}
    cache = os.environ.get("AOTRT_CACHE_DIR") or tempfile.mkdtemp(prefix="aotrt-fuzz-cache-")
    env = dict(os.environ, AOTRT_CACHE_DIR=cache)
    files = M.seed_files()
    log_dir = Path(tempfile.mkdtemp(prefix="aotrt-fuzz-logs-"))
    for c0 in range(0, args.mutants, args.chunk):
        c1 = min(c0 + args.chunk, args.mutants)
        if str(c0) in state["chunks"]:
            continue
        t0 = time.time()
        meta = {}

        def jobs():
            for i in range(c0, c1):
                name, kinds, data = M.mutant(files, i, args.master)
                meta[i] = (name, kinds)
                yield {"id": i, "seed": i, "data": data}

        counts: collections.Counter = collections.Counter()
        for r in H.run_jobs(jobs(), workers=args.workers, timeout=args.timeout,
                            sanitize=args.sanitize, log_dir=log_dir, env=env):
            counts[r["outcome"]] += 1
            if r["outcome"] in H.BAD:
                name, kinds = meta.get(r["id"], ("?", "?"))
                state["bad"].append({"id": r["id"], "seed_program": name, "kinds": kinds,
                                     "outcome": r["outcome"], "stage": r.get("stage"),
                                     "detail": r.get("detail", "")[:400],
                                     "stacks": r.get("stacks", "")})
        state["chunks"][str(c0)] = dict(counts)
        state["seconds"] += time.time() - t0
        state_path.write_text(json.dumps(state))
        total = _total(state)
        done = sum(total.values())
        print(f"[{done}/{args.mutants}] {time.time() - t0:.0f} s this chunk; "
              + ", ".join(f"{k} {v}" for k, v in total.items() if v), flush=True)
        _write(out, args, state)
    total = _total(state)
    print(H.table(total))
    return 1 if any(total.get(k) for k in H.BAD) else 0


def _total(state: dict) -> dict[str, int]:
    total = {k: 0 for k in H.OUTCOMES}
    for c in state["chunks"].values():
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def _write(out: Path, args: argparse.Namespace, state: dict) -> None:
    day = datetime.date.today().isoformat()
    suffix = "-san" if args.sanitize else ""
    total = _total(state)
    res = {"date": day, "mutants": sum(total.values()), "master": args.master,
           "sanitize": args.sanitize, "workers": args.workers, "timeout_s": args.timeout,
           "seconds": round(state["seconds"], 1), "counts": total, "bad": state["bad"][:200],
           "seeds": sorted(M.ALL_SEEDS), "kinds": list(M.KINDS)}
    (out / f"fuzz-{day}{suffix}.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Fuzz campaign {day}", "",
             f"{res['mutants']} mutants of {len(res['seeds'])} seed programs (master seed "
             f"{args.master}), cpu device, {'ASan+UBSan kernels, ' if args.sanitize else ''}"
             f"{args.workers} workers, {args.timeout:.0f} s per mutant, "
             f"{res['seconds']:.0f} s in all.", "", H.table(total), ""]
    if state["bad"]:
        lines += ["## Bad outcomes (first 50)", "", "| id | seed | kinds | outcome | detail |",
                  "|---|---|---|---|---|"]
        for b in state["bad"][:50]:
            d = b["detail"].replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| {b['id']} | {b['seed_program']} | {b['kinds']} | {b['outcome']} "
                         f"| {d} |")
    (out / f"fuzz-{day}{suffix}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
