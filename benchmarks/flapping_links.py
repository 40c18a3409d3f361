"""Half the nodes' links flapping for a whole run: what a switch that keeps dropping costs.

A site on this machine (root: nodes are network namespaces on a bridge, see
tests/helpers/cluster.py): the database host's embedded PostgreSQL, TLS only; a coordinator on
a login node; ``--workers`` worker nodes, one ``tunefleet worker --device host`` each, as the
worker role over TCP with TLS. Two runs of the synthetic problem (``--trials`` trials that
really take ``--duration`` s each):

* ``steady``: no fault;
* ``flapping``: from the start to the run's end, half the worker nodes' links go down for a
  random ``--down`` interval and up again for a random ``--up`` one (seeded), so some outages
  are shorter than the lease and some longer.

Per run: the wall time (all workers registered to the coordinator's exit), trials per second,
the fleet's efficiency (trial seconds finished / (workers x wall)), the outages, what was taken
back (expired leases, released claims), the completions the fence refused (a node's late
results), what each node finished, and the chaos suite's books: lost, duplicated and stuck
trials, and every broken promise (none expected). ``flapping_vs_steady`` is the ratio of the
two throughputs. Prints a table and writes ``flapping_links.json`` to ``--out`` (default
benchmarks/results).

    python benchmarks/flapping_links.py                     # 4 workers, 120 trials of 0.5 s
    python benchmarks/flapping_links.py --workers 4 --trials 30 --duration 0.3   # smoke size
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tests.helpers import cluster
from tests.helpers.chaos import accounting, violations
from tests.helpers.cluster import SiteRun, exit_summary
from tests.helpers.netns import Node
from tunefleet.db.engine import connect


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="worker nodes (half of them flap)")
    p.add_argument("--trials", type=int, default=120, help="trials of each run")
    p.add_argument("--duration", type=float, default=0.5, help="seconds each trial takes")
    p.add_argument("--lease", type=float, default=3.0, help="the workers' --lease, seconds")
    p.add_argument("--down", default="1,5", help="outage length range, seconds: LOW,HIGH")
    p.add_argument("--up", default="1,4", help="time between outages range, seconds: LOW,HIGH")
    p.add_argument("--seed", type=int, default=7, help="seed of the outage schedule")
    p.add_argument("--out", default=None, help="JSON file or folder (default benchmarks/results)")
    args = p.parse_args(argv)
    for name in ("down", "up"):
        try:
            low, high = (float(x) for x in getattr(args, name).split(","))
        except ValueError:
            p.error(f"--{name} {getattr(args, name)!r}: give two seconds, LOW,HIGH (e.g. 1,5)")
        if not 0 < low <= high:
            p.error(f"--{name} {getattr(args, name)!r}: need 0 < LOW <= HIGH")
        setattr(args, name, (low, high))
    if args.workers < 2:
        p.error(f"--workers {args.workers}: need at least 2 (half of them flap)")
    return args


class Flapper:
    """Takes each node's link down and up on a seeded schedule until stopped; records every
    outage."""

    def __init__(self, nodes: list[Node], args: argparse.Namespace) -> None:
        self.stop_event = threading.Event()
        self.outages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(
                target=self._flap, args=(node, random.Random(f"{args.seed}-{node.name}"), args)
            )
            for node in nodes
        ]

    def _flap(self, node: Node, rng: random.Random, args: argparse.Namespace) -> None:
        # A short random offset, so the nodes do not flap in step and the first outage comes
        # while the run is young.
        if self.stop_event.wait(rng.uniform(0.0, 1.0)):
            return
        while not self.stop_event.is_set():
            down = rng.uniform(*args.down)
            started = time.monotonic()
            node.cut()
            self.stop_event.wait(down)
            node.heal()
            with self._lock:
                self.outages.append(
                    {"node": node.name, "down_s": round(time.monotonic() - started, 3)}
                )
            self.stop_event.wait(rng.uniform(*args.up))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(30)


def worker_sessions(conn: Any) -> int:
    [row] = conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity"
        " WHERE datname = current_database() AND usename = 'tunefleet_worker'"
    ).fetchall()
    return int(row["n"])


def run_arm(
    site: cluster.Site, arm: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = [f"node{i + 1}" for i in range(args.workers)]
    flapping = nodes[: args.workers // 2] if arm == "flapping" else []
    env = {"TUNEFLEET_POLL_S": "0.05"}
    with site.database() as db:
        run = SiteRun(site, db, workdir, env)
        flapper = Flapper([site.node(n) for n in flapping], args)
        try:
            run.start_coordinator(
                "login1", "synthetic", "--arg", f"duration={args.duration:g}",
                "--max-trials", str(args.trials), "--confirm", "1",
            )  # fmt: skip
            for node in nodes:
                run.start_worker(node, lease_s=args.lease, poll_s=0.5, prepare_workers=0)
            run.wait_registered()
            started = time.monotonic()
            flapper.start()
            assert run.coordinator is not None
            code = run.coordinator.wait(600)
            wall = time.monotonic() - started
        finally:
            flapper.stop()
            site.net.heal_all()
        try:
            codes = run.stop_workers(timeout=180)
        finally:
            run.close()
        assert run.run_id is not None
        with connect(db.admin_url) as conn:
            broken = violations(conn, run.run_id, args.trials)
            books = accounting(conn, run.run_id)
            per_node = conn.execute(
                """
                SELECT w.host, count(*) AS n FROM tunefleet.attempt a
                  JOIN tunefleet.worker w ON w.id = a.worker_id
                  JOIN tunefleet.trial t ON t.id = a.trial_id
                 WHERE t.run_id = %s AND a.outcome = 'done' GROUP BY w.host ORDER BY w.host
                """,
                (run.run_id,),
            ).fetchall()
            # Sessions of the worker role the server still keeps once every worker left: a
            # node cut off mid-conversation leaves its old one behind, until the server's
            # keepalive probes find it dead (the site's: 2 s, then 3 probes 1 s apart).
            left = worker_sessions(conn)
            waited = time.monotonic()
            deadline = waited + 60
            while worker_sessions(conn) and time.monotonic() < deadline:
                time.sleep(0.2)
            dropped_after = time.monotonic() - waited
            still = worker_sessions(conn)
        logs = [w.log() for _, w in run.workers]
    outages = flapper.outages
    finished = books["finished"]
    return {
        "arm": arm,
        "workers": args.workers,
        "flapping_nodes": len(flapping),
        "coordinator_exit": code,
        "worker_exits": codes,
        "wall_s": round(wall, 3),
        "trials_per_s": round(finished / wall, 3),
        "fleet_efficiency": round(finished * args.duration / (args.workers * wall), 3),
        "outages": len(outages),
        "down_s_total": round(sum(o["down_s"] for o in outages), 3),
        "longest_outage_s": max((o["down_s"] for o in outages), default=0.0),
        "outages_longer_than_lease": sum(o["down_s"] > args.lease for o in outages),
        **books,
        "fenced_completions": sum(
            len(re.findall(r"completion rejected: trial", log)) for log in logs
        ),
        "abandoned_by_heartbeat": sum(len(re.findall(r"heartbeat rejected", log)) for log in logs),
        "done_by_node": {r["host"]: r["n"] for r in per_node},
        "exit_summaries": [exit_summary(log) for log in logs],
        "worker_sessions_left": left,
        "worker_sessions_dropped_after_s": round(dropped_after, 3) if left else 0.0,
        "worker_sessions_never_dropped": still,
        "violations": broken,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = cluster.unavailable()
    if reason:
        print(f"flapping_links: cannot build the site here: {reason}", file=sys.stderr)
        return 2
    meta = h.machine()
    t0 = time.monotonic()
    arms = []
    with h.sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="tunefleet-flap-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # the embedded server's user must reach its data directory
        nodes = ["login1", *(f"node{i + 1}" for i in range(args.workers))]
        with cluster.cluster_site(base / "site", nodes) as site:
            for arm in ("steady", "flapping"):
                print(f"{h.elapsed(t0)} {arm}: {args.trials} trials of {args.duration:g} s ...")
                arms.append(run_arm(site, arm, args, base / arm))
    steady, flapped = arms
    data = {
        "benchmark": "flapping_links",
        "machine": meta,
        "settings": {
            "workers": args.workers,
            "trials": args.trials,
            "duration_s": args.duration,
            "lease_s": args.lease,
            "down_s": list(args.down),
            "up_s": list(args.up),
            "seed": args.seed,
        },
        "arms": arms,
        "flapping_vs_steady": round(flapped["trials_per_s"] / steady["trials_per_s"], 3),
    }
    columns = [
        "arm", "wall_s", "trials_per_s", "fleet_efficiency", "outages", "lease_expired",
        "fenced_completions", "lost", "duplicated", "stuck",
    ]  # fmt: skip
    print(h.table(columns, [[a[c] for c in columns] for a in arms]))
    print(f"flapping vs steady throughput: {data['flapping_vs_steady']}")
    h.write_json("flapping_links", data, args.out)
    bad = [
        a
        for a in arms
        if a["violations"] or a["lost"] or a["duplicated"] or a["stuck"]
        or a["worker_sessions_never_dropped"]
    ]  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
