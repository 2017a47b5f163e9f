"""A Hydra multirun as one program (``hydra/launcher=stacked``): the jobs that share a shape run side by side in one
process, each through the ServerApp round loop of a lone ``engine=batched`` run, and every round the clients of all
of them are trained together (:mod:`server.stacked.trainer`). Each job writes the run directory a lone run writes.
With ``hydra.launcher.processes=P`` a group is split into P such programs, run side by side in worker processes
(:mod:`server.stacked.processes`).
"""

# the options of hydra/launcher=stacked (hydra.launcher.<option>)
LAUNCHER_OPTIONS = ("require_stacked", "max_jobs", "share_chunks", "processes")
