"""Every use of another library's internals (Flower's and Ray's non-public modules, private attributes, patches of
their functions, a rewritten Flower method) lives in this package; the engines (``server/ray``, ``server/deploy``,
``server/batched``) and the rest of the project import these modules instead.

- :mod:`~server.internals.pins`: the one list of what is used, where and why, the library versions it was read in,
  and fingerprints of the library code whose work is rewritten or replaced here;
- :mod:`~server.internals.scan`: an ``ast`` scan that finds library internals imported anywhere else;
- ``flower_object_pulls``, ``flower_supernode``, ``flower_superlink``, ``flower_clientapp``: the short waits and
  the warm ClientApp worker of ``flower-deploy`` (:mod:`server.deploy.flwr_fast` launches them);
- ``flower_control``: the SuperLink's Control API client of ``flower-deploy``;
- ``flower_link_state``: the simulation's LinkState indexed by node (Ray engine);
- ``ray_port_wait``: Ray's start-up wait for the GCS port with the GIL released; ``ray_cluster``: the address
  file of a local Ray cluster and Flower's actor count per node;
- ``flower_grid``: message ids, task identity and error codes for the batched engine's in-process grid;
- ``flower_fab``, ``flower_strategy``, ``flower_datasets``: Flower's FAB builder, its strategies' node sampling,
  flwr-datasets' loaded splits.

``tests/server/test_internals_pins.py`` imports every pinned name, checks the fingerprints and the installed versions,
and fails naming what changed.
"""
