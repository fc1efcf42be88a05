"""wdelta inside inference engines and trainers: vLLM, TRL, SGLang.

Nothing here imports an engine at import time: ``wdelta.integrations.vllm``
registers the ``wdelta`` weight-transfer backend with vLLM only when vLLM's
plugin loader calls it, and each adapter imports its engine where it needs it.
The engine-independent part is :class:`NodeWeights` (``node.py``): a host
copy of the checkpoint at a chain version that moves to any version and says
which tensors to hand to the model's ``load_weights``.
"""

from .node import InitInfo, NodeWeights, UpdateInfo

__all__ = ["InitInfo", "NodeWeights", "UpdateInfo"]
