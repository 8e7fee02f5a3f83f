"""adaptdl_core: elastic, goodput-adaptive training for PyTorch (no Ray needed).

Modules: :mod:`adaptdl_core.env` (the ADAPTDL_* variables), :mod:`adaptdl_core.checkpoint`
(States and atomic checkpoints), :mod:`adaptdl_core.collective` (small-object collectives
with timeouts), :mod:`adaptdl_core.goodput` (throughput and statistical-efficiency
models), :mod:`adaptdl_core.policy` (cluster allocation) and :mod:`adaptdl_core.torch`
(the training API).
"""

__version__ = "0.1.0"
