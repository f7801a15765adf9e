"""The job commands of the ``pyhpc`` CLI: render, submit, status, logs, cancel,
train, scale, report. Registered by :func:`add_commands`; torch is imported only
by ``train`` and ``scale``, inside the command.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pyhpc.jobspec import JobSpecError
from pyhpc.metrics import MetricsError
from pyhpc.render import RenderError
from pyhpc.submit import SubmitError
from pyhpc.watch import WatchError

USER_ERRORS: tuple[type[Exception], ...] = (
    JobSpecError, RenderError, SubmitError, WatchError, MetricsError)
RESOURCE_FLAGS = ("nodes", "tasks_per_node", "gpus_per_node", "partition", "time", "job_name")
FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _emit(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


def _cluster() -> Any:
    from pyhpc import cluster, paths

    return cluster.load(paths.cluster_file())


def _int_list(name: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise JobSpecError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise JobSpecError(f"{name}: must be integers >= 1, got {text!r}")
    return values


def cmd_render(args: argparse.Namespace) -> int:
    from pyhpc import render

    if args.list:
        env = render.environment(_cluster())
        data = {t: sorted(render.variables(env, t + render.SUFFIX)) for t in render.available()}
        _emit(data, args.json, "\n".join(f"{t}: {', '.join(v)}" for t, v in data.items()))
        return 0
    if not args.template:
        raise RenderError("template: required (or --list)")
    sys.stdout.write(render.render(args.template, render.parse_sets(args.set), _cluster()))
    return 0


def _kind(target: str) -> str:
    from pyhpc import render

    if Path(target).is_file() and not target.endswith(".j2"):
        return "script"
    if target.endswith(".j2") or target in render.available():
        return "template"
    if FUNCTION_RE.match(target):
        return "function"
    return "script"


def cmd_submit(args: argparse.Namespace) -> int:
    from pyhpc import render, submit
    from pyhpc.jobspec import JobSpec, check

    kind = _kind(args.target)
    given = {k: getattr(args, k) for k in RESOURCE_FLAGS if getattr(args, k) is not None}
    result: dict[str, Any] = {"kind": kind, "target": args.target}
    if kind == "function":
        fn = submit.resolve_function(args.target)
        job = submit.submit(fn, *args.args, nodes=1 if args.nodes is None else args.nodes,
                            tasks_per_node=args.tasks_per_node,
                            gpus_per_node=args.gpus_per_node or 0, partition=args.partition,
                            name=args.job_name or args.target.split(":")[1],
                            folder=args.folder, cluster=_cluster())
        result.update(job_id=str(job.job_id), folder=str(Path(args.folder).parent))
    else:
        if kind == "template":
            values = {**render.parse_sets(args.set), **given}
            job = submit.submit_template(args.target, values, _cluster(), args.test_only)
            result.update(script=str(job.script), **({"test_only": job.job_id} if args.test_only
                                                     else {"job_id": job.job_id}))
        else:
            if args.set:
                raise SubmitError("--set: only templates take variables; "
                                  f"{args.target!r} is a script")
            script = Path(args.target)
            if not script.is_file():
                raise SubmitError(f"script: no such file {args.target!r} (and no template "
                                  f"of that name; templates: {', '.join(render.available())})")
            spec = check(JobSpec(nodes=1 if args.nodes is None else args.nodes,
                                 tasks_per_node=args.tasks_per_node or 1,
                                 gpus_per_node=args.gpus_per_node or 0, partition=args.partition,
                                 time=args.time or "00:10:00"), _cluster())
            flag = {"tasks_per_node": "ntasks-per-node"}
            options = [f"--{flag.get(k, k.replace('_', '-'))}={getattr(spec, k, None) or given[k]}"
                       for k in given]
            out = submit.sbatch(script, options, test_only=args.test_only)
            result.update(script=str(script), **({"test_only": out} if args.test_only
                                                 else {"job_id": out}))
    if args.wait and "job_id" in result:
        from pyhpc import watch

        result["state"] = watch.watch([result["job_id"]], interval_s=1.0)[result["job_id"]]
    _emit(result, args.json, result.get("job_id") or result.get("test_only", ""))
    return 0 if result.get("state", "COMPLETED") == "COMPLETED" else 1


def cmd_status(args: argparse.Namespace) -> int:
    from pyhpc import watch

    ids = args.job_ids
    if not ids:
        proc = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise WatchError(f"squeue: {proc.stderr.strip()}")
        ids = sorted({line.split("_")[0] for line in proc.stdout.split()})
    if args.watch:
        states = watch.watch(ids, interval_s=args.interval, source=args.source or "squeue")
    else:
        states = watch.query(ids, source=args.source or "sacct")
    _emit(states, args.json, "\n".join(f"{j}\t{s}" for j, s in states.items()))
    return 0


def _log_paths(job_id: str) -> list[Path]:
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, check=False)
    found = re.findall(r"\bStd(?:Out|Err)=(\S+)", proc.stdout)
    paths = [Path(p) for p in dict.fromkeys(found)]
    paths += sorted(Path("pyhpc-jobs").glob(f"{job_id}/*_log.*"))
    return [p for p in dict.fromkeys(paths) if p.is_file()]


def cmd_logs(args: argparse.Namespace) -> int:
    paths = _log_paths(args.job_id)
    if not paths:
        raise WatchError(f"job_id: no log files found for job {args.job_id!r}")
    for path in paths:
        if len(paths) > 1:
            print(f"==> {path} <==")
        sys.stdout.write(path.read_text(errors="replace"))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    proc = subprocess.run(["scancel", *args.job_ids], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise WatchError(f"scancel: {proc.stderr.strip()}")
    print(f"cancelled {' '.join(args.job_ids)}")
    return 0


def _train_config(args: argparse.Namespace, out: Path, batch: int) -> Any:
    from pyhpc.train import TrainConfig

    return TrainConfig(out=str(out.resolve()), mode=args.mode, epochs=args.epochs,
                       batch_size=batch, lr=args.lr, seed=args.seed,
                       warmup_steps=args.warmup_steps,
                       synthetic_samples=args.synthetic_samples)


def _check_train(args: argparse.Namespace, cfg: Any, nodes: int) -> None:
    from pyhpc.train import check_steps

    if nodes < 1:
        return  # the resource check names that error
    try:
        check_steps(cfg, nodes * (args.tasks_per_node or max(args.gpus_per_node, 1)))
    except ValueError as exc:
        raise JobSpecError(str(exc)) from None


def _submit_train(args: argparse.Namespace, cfg: Any, nodes: int) -> Any:
    from pyhpc import submit
    from pyhpc.train import Trainer

    _check_train(args, cfg, nodes)

    return submit.submit(Trainer(cfg), nodes=nodes, tasks_per_node=args.tasks_per_node,
                         gpus_per_node=args.gpus_per_node, partition=args.partition,
                         name=f"train-{cfg.mode}", folder=args.folder, distributed=False,
                         cluster=_cluster())


def cmd_train(args: argparse.Namespace) -> int:
    out = Path(args.out or f"pyhpc-runs/train-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg = _train_config(args, out, args.batch_size)
    if args.local:
        from pyhpc import train

        _check_train(args, cfg, 1)
        summary = train.run(cfg)
        result: dict[str, Any] = {"out": str(out), "summary": summary.row() if summary else None}
    else:
        job = _submit_train(args, cfg, args.nodes)
        result = {"job_id": str(job.job_id), "out": str(out)}
        if args.wait:
            from pyhpc import watch

            result["state"] = watch.watch([str(job.job_id)], interval_s=1.0)[str(job.job_id)]
    _emit(result, args.json, json.dumps(result))
    return 0 if result.get("state", "COMPLETED") == "COMPLETED" else 1


def cmd_scale(args: argparse.Namespace) -> int:
    from pyhpc import watch

    from pyhpc.jobspec import JobSpec, check

    nodes, batches = _int_list("nodes", args.nodes), _int_list("batch_sizes", args.batch_sizes)
    out, jobs, plan = Path(args.out), {}, []
    tasks = args.tasks_per_node or max(args.gpus_per_node, 1)
    for n in nodes:  # check the whole sweep first: a bad point submits nothing
        check(JobSpec(nodes=n, tasks_per_node=tasks, gpus_per_node=args.gpus_per_node,
                      partition=args.partition), _cluster())
        for b in batches:
            workers = n * tasks
            if args.scaling == "strong" and b % workers:
                raise JobSpecError(f"batch_sizes: global batch {b} does not divide over "
                                   f"{workers} workers (strong scaling)")
            local = b if args.scaling == "weak" else b // workers
            plan.append((n, _train_config(args, out / f"nodes{n}-batch{b}", local)))
            _check_train(args, plan[-1][1], n)
    for n, cfg in plan:
        jobs[str(_submit_train(args, cfg, n).job_id)] = cfg.out
    states = watch.watch(list(jobs), interval_s=args.interval)
    result = {"jobs": {j: {"out": o, "state": states[j]} for j, o in jobs.items()}}
    if all(s == "COMPLETED" for s in states.values()):
        result["report"] = _report([out], args.scaling, out / "scaling.png", args.json)
    else:
        _emit(result, args.json, json.dumps(result, indent=2))
    return 0 if all(s == "COMPLETED" for s in states.values()) else 1


def _report(dirs: list[Path], scaling: str, png: Path, as_json: bool) -> dict[str, Any]:
    from pyhpc import metrics, report

    runs = metrics.efficiency(report.collect(dirs), scaling)
    report.plot(runs, png)
    data = {"png": str(png), "runs": [r.row() for r in runs]}
    _emit(data, as_json, report.table(runs) + f"\nplot: {png}")
    return data


def cmd_report(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    png = Path(args.png) if args.png else (dirs[0] if dirs[0].is_dir() else Path(".")) / "scaling.png"
    _report(dirs, args.scaling, png, args.json)
    return 0


def _resources(p: argparse.ArgumentParser, defaults: bool, sweep: bool = False) -> None:
    if sweep:
        p.add_argument("--nodes", default="1,2", help="comma-separated node counts")
    else:
        p.add_argument("--nodes", type=int, default=1 if defaults else None, help="nodes (>= 1)")
    p.add_argument("--tasks-per-node", type=int, help="tasks per node (default: one per GPU)")
    p.add_argument("--gpus-per-node", type=int, default=0 if defaults else None,
                   help="GPUs per node (the partition must have them)")
    p.add_argument("--partition", help="partition (default: the cluster's default)")
    p.add_argument("--folder", default="pyhpc-jobs/%j", help="submitit folder (logs, pickles)")


def _train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=("digits", "synthetic"), default="digits")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--synthetic-samples", type=int, default=512,
                   help="data set size in synthetic mode")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def add_commands(sub: Any) -> None:
    """Register the job commands on the CLI's subparsers."""
    p = sub.add_parser("render", help="render a job template to stdout")
    p.add_argument("template", nargs="?", help="template name (see --list) or a .j2 path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="template variable (repeatable)")
    p.add_argument("--list", action="store_true", help="list templates and their variables")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("submit", help="submit a template, a batch script or module:function")
    p.add_argument("target", help="template name/.j2 path, script path, or module:function")
    p.add_argument("args", nargs="*", help="arguments for module:function")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="template variable (repeatable)")
    _resources(p, defaults=False)
    p.add_argument("--time", help="time limit (e.g. 00:10:00)")
    p.add_argument("--job-name", help="job name")
    p.add_argument("--test-only", action="store_true", help="sbatch --test-only: submit nothing")
    p.add_argument("--wait", action="store_true", help="wait for the job to finish")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="job states (one Slurm query for all jobs)")
    p.add_argument("job_ids", nargs="*", help="job ids (default: your queued jobs)")
    p.add_argument("--watch", action="store_true", help="poll until all have finished")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--source", choices=("sacct", "squeue"),
                   help="default: sacct for one query, squeue with --watch")
    p.add_argument("--json", action="store_true", help="print states as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="print a job's output files")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel jobs")
    p.add_argument("job_ids", nargs="+")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("train", help="the reference workload (LeNet on digits, or synthetic)")
    _resources(p, defaults=True)
    _train_options(p)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--out", help="run directory (checkpoint, metrics)")
    p.add_argument("--local", action="store_true", help="run here, one process, no Slurm")
    p.add_argument("--wait", action="store_true", help="wait for the job to finish")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("scale", help="sweep node counts x batch sizes, then report")
    _resources(p, defaults=True, sweep=True)
    _train_options(p)
    p.set_defaults(mode="synthetic", epochs=1)
    p.add_argument("--batch-sizes", default="32", help="comma-separated (per worker if weak)")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--out", required=True, help="sweep directory")
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("report", help="table + PNG of throughput and efficiency vs workers")
    p.add_argument("dirs", nargs="+", help="run or sweep directories (metrics.jsonl inside)")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak")
    p.add_argument("--png", help="plot path (default: DIR/scaling.png)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    p.set_defaults(func=cmd_report)
