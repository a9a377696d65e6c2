#!/usr/bin/env python3
"""The proven gap of `tune`'s best schedule (issue 29): at P in {8, 16}, M in {2P, 4P}, per-rank
memory from P/2 to unbounded, a Markdown table of tune's best makespan, the limit under it (no
schedule of the placements and kinds tune tries is faster: `lower_bound` of `tune --format
json`) and the gap; then the same for the schedules that keep their activations (no recompute or
offload), against the limit those can reach (the least `lower_bound` of those candidates, each
the memory limit's forced bound of its placement).

    tools/gap_table.py [--bin target/release/pipeweave] [--costs F=1,I=1,W=1] > table.md
"""
import argparse
import json
import subprocess
import time

RESIDENCY = ("recompute(", "offload(")


def tune(binary, ranks, microbatches, memory, costs):
    cmd = [binary, "tune", "-p", str(ranks), "-m", str(microbatches), "--format", "json", "--top", "100000"]
    if memory is not None:
        cmd += ["--memory-limit", str(memory)]
    if costs:
        cmd += ["--costs", costs]
    start = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out), time.time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="target/release/pipeweave")
    parser.add_argument("--costs", default="")
    args = parser.parse_args()
    print("| P | M | memory | tune's best | makespan | limit | gap | best keeping activations | makespan | limit | gap | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ranks in (8, 16):
        for microbatches in (2 * ranks, 4 * ranks):
            for memory in (ranks // 2, 3 * ranks // 4, ranks, 2 * ranks, None):
                report, seconds = tune(args.bin, ranks, microbatches, memory, args.costs)
                cands = report["candidates"]
                if not cands:
                    print(f"| {ranks} | {microbatches} | {memory} | nothing fits | | | | | | | | {seconds:.1f} |")
                    continue
                best = cands[0]
                keeping = [c for c in cands if not c["expression"].startswith(RESIDENCY)]
                row = [str(ranks), str(microbatches), "unbounded" if memory is None else str(memory),
                       f"`{best['expression']}`", f"{best['makespan']:.3f}", f"{report['lower_bound']:.3f}",
                       f"{100 * report['optimality_gap']:.2f}%"]
                if keeping:
                    k = keeping[0]
                    limit = min(c["lower_bound"] for c in keeping)
                    row += [f"`{k['expression']}`", f"{k['makespan']:.3f}", f"{limit:.3f}",
                            f"{100 * (k['makespan'] / limit - 1):.2f}%"]
                else:
                    row += ["none fits", "", "", ""]
                row.append(f"{seconds:.1f}")
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
