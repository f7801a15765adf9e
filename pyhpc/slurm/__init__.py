"""Everything that reaches Slurm: the job spec (:mod:`~pyhpc.slurm.jobspec`), rendered
templates, submission through submitit or sbatch, watching, and the one module that runs
Slurm's commands (:mod:`~pyhpc.slurm.slurm`)."""
