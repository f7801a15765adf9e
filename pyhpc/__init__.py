"""pyhpc: a GPU research cluster in a box (deploy, submit, measure).

``import pyhpc`` stays light: torch and submitit are imported only when a job is
submitted or run.
"""
from pyhpc._submit import ScriptJob as ScriptJob
from pyhpc._submit import SubmitError as SubmitError
from pyhpc._submit import submit as submit
from pyhpc._submit import submit_array as submit_array
from pyhpc._submit import submit_script as submit_script
from pyhpc._submit import submit_template as submit_template
from pyhpc.errors import PyhpcError as PyhpcError
from pyhpc.jobspec import JobSpec as JobSpec

__version__ = "0.1.0"
