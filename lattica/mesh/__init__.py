"""Local meshes of real node processes, for the demo, the benchmarks and the tests.

- ``process.py``: a node run as its own process (``python -m lattica.mesh.process``) and
  :class:`ServerProcess`, which starts one and reads back its PeerId and addresses;
- ``supervised.py``: node processes running stateful children under a supervisor, and the loss
  of one of them, measured.
"""
