"""Speed and memory of splitformer against the libraries people already use.

``sizes`` (the network sizes), ``timing`` (contenders measured side by side: interleaved
medians, the machine's matmul peak, peak memory), ``peers`` (the reference networks: torch.nn,
Hugging Face, timm, x-transformers, a hand-written ODE-Transformer block) and ``suites`` (what
``splitformer bench`` runs). The reference libraries are imported only when a suite asks for
them; a missing one skips its rows with the reason.
"""

from .sizes import SIZES, Size, parse_size
from .timing import PATHS, Contender, matmul_peak, measure, peak_memory

__all__ = ["PATHS", "SIZES", "Contender", "Size", "matmul_peak", "measure", "parse_size",
           "peak_memory"]
