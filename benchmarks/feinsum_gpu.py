"""Tune feinsum's shipped transform spaces through tunefleet on one machine, end to end.

For each space: ``tunefleet tune feinsum`` (embedded PostgreSQL, one local worker on the GPU)
with a fixed budget for the batched face-mass einsum ``ifj,fe,fej->ei`` (default: 4 fields,
35 volume nodes, 4 faces, 15 face nodes, 100000 elements, float64). Then the run is exported
as a feinsum archive, feinsum's own ``query`` reads it back on the same device, and the archive
is imported into the database again (as ``imported`` measurements, the cached results of
feinsum-timed runs).

Prints one line per space (evaluations by outcome, best GFLOP/s, wall time) and writes
``feinsum_gpu.json`` to ``--out``. Needs feinsum (Python >= 3.12) and an OpenCL device.

    python benchmarks/feinsum_gpu.py --out results/ [--trials 16] [--max-time 240]
        [--spaces ifj_fe_fej_to_ei_v2.py,ifj_fe_fej_to_ei_v3.py] [--device 0]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_SPACES = "ifj_fe_fej_to_ei_v2.py,ifj_fe_fej_to_ei_v3.py"


def tunefleet(
    env: dict[str, str], *argv: str, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tunefleet", *argv]
    print("$", " ".join(cmd[2:]), flush=True)
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc


def einsum_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--arg", "einsum=ifj,fe,fej->ei",
        "--size", f"i={args.nvoldof},f={args.nface},j={args.nfacedof}",
        "--arg", f"batch={args.fields}",
        "--arg", "operands=L,J,v*",
        "--size", f"long_dim_length={args.long_dim_length}",
        "--dtype", "float64",
    ]  # fmt: skip


def run_stats(url: str, run_id: int) -> dict[str, Any]:
    from tunefleet.db.engine import connect

    with connect(url) as conn:
        p = conn.execute(
            "SELECT done, invalid, failed, timed_out, cached, best_gflops, best_median_s"
            " FROM tunefleet.run_progress WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        best = conn.execute(
            "SELECT config, median_s, gflops, device_name FROM tunefleet.best_per_run"
            " WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    stats = {k: (float(v) if k.startswith("best") and v is not None else v) for k, v in p.items()}
    stats["evaluations"] = sum(int(p[k]) for k in ("done", "invalid", "failed", "timed_out"))
    stats["best_config"] = best["config"] if best else None
    stats["device_name"] = best["device_name"] if best else None
    return stats


def feinsum_query(archive: Path, args: argparse.Namespace, device_index: int) -> dict[str, Any]:
    """What feinsum itself reads from the exported archive on this device."""
    import feinsum as fe
    import pyopencl as cl

    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    device = devices[device_index]
    einsum = fe.batched_einsum(
        "ifj,fe,fej->ei",
        [
            [
                fe.array("L", (args.nvoldof, args.nface, args.nfacedof)),
                fe.array("J", (args.nface, "E")),
                fe.array(f"v{r}", (args.nface, "E", args.nfacedof)),
            ]
            for r in range(args.fields)
        ],
    )
    facts = fe.query(einsum, device, database=str(archive))
    rates = [sum(q.giga_op_rate(dt) for dt in q.giga_op_info) for q in facts]
    return {
        "rows": len(facts),
        "transform_ids": sorted({q.transform_id for q in facts}),
        "best_gops": max(rates) if rates else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--spaces", default=DEFAULT_SPACES, help="comma-separated shipped spaces")
    parser.add_argument("--trials", type=int, default=16, help="evaluation budget per space")
    parser.add_argument("--max-time", type=float, default=240.0, help="seconds per space")
    parser.add_argument("--fields", type=int, default=4)
    parser.add_argument("--nvoldof", type=int, default=35)
    parser.add_argument("--nface", type=int, default=4)
    parser.add_argument("--nfacedof", type=int, default=15)
    parser.add_argument("--long-dim-length", type=int, default=100_000)
    parser.add_argument("--device", default="0", help="OpenCL device index for the worker")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    try:
        import feinsum  # noqa: F401
    except Exception as exc:
        print(f"feinsum is not importable: {exc!r}", file=sys.stderr)
        return 2

    home = Path(tempfile.mkdtemp(prefix="tunefleet-feinsum-"))
    env = dict(os.environ, TUNEFLEET_HOME=str(home), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TUNEFLEET_DATABASE_URL", None)
    results: dict[str, Any] = {
        "einsum": "ifj,fe,fej->ei",
        "parameters": vars(args) | {"out": str(args.out)},
    }
    if tunefleet(env, "db", "start").returncode != 0:
        return 1
    url = tunefleet(env, "db", "url").stdout.strip()
    archive = args.out / "feinsum_archive.sqlite"
    archive.unlink(missing_ok=True)
    runs = []
    try:
        for space in [s.strip() for s in args.spaces.split(",") if s.strip()]:
            started = time.perf_counter()
            proc = tunefleet(
                env, "tune", "feinsum", "--arg", f"space=feinsum:{space}", *einsum_flags(args),
                "--max-trials", str(args.trials), "--max-time", str(args.max_time),
                "--workers", "1", "--device", args.device, "--progress-every", "15",
                "--name", f"feinsum {space}",
            )  # fmt: skip
            wall = time.perf_counter() - started
            found = re.search(r"^run (\d+)", proc.stdout, re.MULTILINE)
            entry: dict[str, Any] = {"space": space, "wall_s": wall, "exit": proc.returncode}
            if found:
                run_id = int(found.group(1))
                entry["run"] = run_id
                entry.update(run_stats(url, run_id))
                exported = tunefleet(
                    env, "feinsum", "export", str(run_id), str(archive), "--db", url
                )
                entry["exported"] = exported.returncode == 0
            else:
                entry["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
            runs.append(entry)
        results["runs"] = runs
        if archive.exists():
            results["feinsum_query"] = feinsum_query(archive, args, int(args.device))
            again = tunefleet(env, "feinsum", "import", str(archive), "--db", url)
            results["reimport"] = again.stdout.strip()
    finally:
        tunefleet(env, "db", "stop")
    (args.out / "feinsum_gpu.json").write_text(json.dumps(results, indent=2, default=str))

    head = ("space", "evals", "done", "inval", "fail", "best GFLOP/s", "wall s")
    print("\n{:34} {:>5} {:>4} {:>5} {:>4} {:>12} {:>7}".format(*head))
    for r in runs:
        best = r.get("best_gflops")
        failed = int(r.get("failed") or 0) + int(r.get("timed_out") or 0)
        print(
            f"{r['space']:34} {r.get('evaluations', 0):>5} {r.get('done', 0):>4} "
            f"{r.get('invalid', 0):>5} {failed:>4} "
            f"{(f'{best:.1f}' if best else '-'):>12} {r['wall_s']:>7.1f}"
        )
    if "feinsum_query" in results:
        q = results["feinsum_query"]
        print(
            f"feinsum.query on the exported archive: {q['rows']} rows, best {q['best_gops']} GOp/s"
        )
    print(f"wrote {args.out / 'feinsum_gpu.json'}")
    return 0 if runs and all(r.get("exit") == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
