"""The hub: JupyterHub on the login host, each user's notebook server a Slurm job.

What the form offers and what it accepts (``choices``, ``options``, ``form``), the batch
script (``script``) and the hub's REST API and address (``api``) are plain pyhpc; only
``spawner`` and ``auth`` import JupyterHub and batchspawner, in the hub's own virtualenv.
"""
