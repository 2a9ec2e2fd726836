"""Test-only stand-in for torchvision.

PyPI's torchvision does not import beside the CPU torch 2.13.0 wheel this project pins
('operator torchvision::nms does not exist'), and timm imports a few names from it at import time.
The tests put this folder on sys.path only when the real torchvision cannot be imported; nothing
here is used by the code paths the tests exercise (timm's VisionTransformer). Never shipped in the
library.
"""

__version__ = "0.0-stub"
