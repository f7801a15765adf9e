"""``python -m pyhpc.train``: one training rank, as srun and torchrun start it
(:func:`pyhpc.train.loop.main`; with ``--pipeline`` above 1, :func:`pyhpc.train.pipeline.main`)."""
import sys

from pyhpc.errors import PyhpcError
from pyhpc.train.loop import main, parse_args


def _main() -> int:
    try:
        cfg = parse_args(sys.argv[1:])
    except PyhpcError as exc:
        print(f"pyhpc.train: {exc}", file=sys.stderr, flush=True)
        return 2
    if cfg.pipeline == 1:
        return main()
    from pyhpc.train import pipeline

    return pipeline.main(cfg)


sys.exit(_main())
