"""The plots of ``python -m benchmarks.scale``: docs/scale-*.png, one per part it measured."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import record

DOCS = record.ROOT / "docs"


def plot(result: dict[str, Any], docs: Path = DOCS) -> list[Path]:
    """Each part's figures in ``result`` (a result file's ``figures``) as a PNG in ``docs``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = docs / f"scale-{name}.png"
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
        plt.close(fig)
        made.append(path)

    if "deploy" in result:
        runs = result["deploy"]["runs"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for key, label in (("fresh_s", "deploy"), ("rerun_s", "idempotent re-run")):
            ax.plot([r["nodes"] for r in runs], [r[key] for r in runs], "o-", label=label)
        ax.set(xscale="log", xlabel="emulated GPU nodes", ylabel="seconds", ylim=(0, None),
               title="Deploy time vs nodes")
        ax.set_xticks([r["nodes"] for r in runs], [str(r["nodes"]) for r in runs])
        ax.legend()
        save(fig, "deploy")
    if "srun" in result:
        rows = result["srun"]["rows"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["nodes"] for r in rows], [r["median_s"] for r in rows], "o-")
        ax.set(xscale="log", xlabel="nodes (srun -N k true)", ylabel="seconds (median of 5)",
               ylim=(0, None), title="Job launch latency vs nodes")
        ax.set_xticks([r["nodes"] for r in rows], [str(r["nodes"]) for r in rows])
        save(fig, "srun")
    if "submit" in result:
        ways = result["submit"]["ways"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.barh(list(ways), [w["jobs_per_s"] for w in ways.values()])
        ax.set(xscale="log", xlabel="jobs/s (log)", title="Submitting 1,000 jobs")
        save(fig, "submit")
    if "complete" in result:
        runs = result["complete"]["runs"]
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar(list(runs), [r["jobs_per_s"] for r in runs.values()])
        ax.set(ylabel="jobs/s", title="1,000 trivial jobs to COMPLETED")
        save(fig, "complete")
    if "status" in result:
        rows = result["status"]["rows"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["jobs"] for r in rows], [r["poll_median_s"] * 1000 for r in rows], "o-")
        ax.set(xlabel="jobs watched", ylabel="ms per poll (1 squeue)", ylim=(0, None),
               title="Watcher poll latency vs jobs")
        save(fig, "status")
    if "ddp" in result:
        rows = result["ddp"]["rows"]
        keys = ["queue_wait_s", "launch_s", "interpreter_and_imports_s", "rendezvous_s",
                "first_step_s"]
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [f"{r['nodes']}n {kind}" for r in rows for kind in ("bare", "pyhpc")]
        bottom = [0.0] * len(labels)
        for key in keys:
            vals = [max(r[kind][key], 0.0) for r in rows for kind in ("bare", "pyhpc")]
            ax.bar(labels, vals, bottom=bottom, label=key.removesuffix("_s").replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set(ylabel="seconds from sbatch", title="Time to first optimizer step")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=7)
        save(fig, "ddp")
    return made
