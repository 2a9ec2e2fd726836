def __getattr__(name):
    def _missing(*args, **kwargs):
        raise RuntimeError(f"torchvision stub: datasets.{name} is not available in tests")

    return type(name, (), {"__init__": _missing})
