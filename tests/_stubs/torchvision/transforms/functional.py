from . import InterpolationMode  # noqa: F401


def __getattr__(name):
    def _missing(*args, **kwargs):
        raise RuntimeError(f"torchvision stub: transforms.functional.{name} is not available")

    return _missing
