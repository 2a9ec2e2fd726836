"""Images as a model takes them, prepared as the Hugging Face image processors prepare them.

``read_image`` opens a PNG or JPEG file as 8-bit RGB (a 16-bit image scaled, transparency
composited onto white: each a note); ``fit_file_image`` resizes and crops it on its 8-bit
pixels with Pillow's filter, ``fit_image`` does the same for a data set's images (N, C, H, W)
in [0, 1]; both then rescale and normalise as the ``ImageSpec`` says. ``size_notes``,
``channel_note`` and ``preparation`` say what that did (for the notes and the input record).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .subject import ImageSpec, InputError, Subject

__all__ = ["RESAMPLE", "channel_note", "fit_file_image", "fit_image", "image_prepared",
           "preparation", "read_image", "size_notes"]

# Pillow's filters by the number preprocessor_config.json gives (HF's PILImageResampling)
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _resized_size(h: int, w: int, spec: ImageSpec) -> tuple[tuple[int, int], tuple[int, int]]:
    """((height, width) to resize to, (top, left) of the crop of spec's size), as the Hugging
    Face processors compute them: ``size`` (height, width) as is; ``shortest_edge`` s < 384:
    the short side to int(s / crop_pct), the long side to int(that * long / short), then the
    centre s x s crop; s >= 384: s x s, no crop."""
    if spec.shortest_edge is None:
        return (spec.height, spec.width), (0, 0)
    s = spec.shortest_edge
    if s >= 384:
        return (s, s), (0, 0)
    short_target = int(s / (spec.crop_pct if spec.crop_pct else 1.0))
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = short_target, int(short_target * long / short)
    size = (new_long, new_short) if w <= h else (new_short, new_long)
    return size, ((size[0] - spec.height) // 2, (size[1] - spec.width) // 2)


def _channels(x: Any, channels: int) -> Any:
    import torch

    c = x.shape[1]
    if c == channels:
        return x
    if c == 1:
        return x.expand(-1, channels, -1, -1)
    if channels == 1:
        if c == 3:
            w = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype)
            return (x * w.view(1, 3, 1, 1)).sum(1, keepdim=True)
        return x.mean(1, keepdim=True)
    return x[:, :1].expand(-1, channels, -1, -1)


def _resize_tensor(x: Any, size: tuple[int, int], resample: int) -> Any:
    """Images (N, C, H, W) in [0, 1] resized by Pillow's filter ``resample`` (each channel a
    32-bit float image), clipped to [0, 1] as an 8-bit image would be."""
    import numpy as np
    import torch
    from PIL import Image

    if tuple(x.shape[-2:]) == tuple(size):
        return x
    out = np.empty((*x.shape[:2], *size), dtype=np.float32)
    arr = x.detach().float().cpu().numpy()
    for i in range(arr.shape[0]):
        for c in range(arr.shape[1]):
            img = Image.fromarray(np.ascontiguousarray(arr[i, c]), mode="F")
            out[i, c] = np.asarray(img.resize((size[1], size[0]), resample=resample))
    return torch.from_numpy(out).clamp(0, 1).to(x.dtype)


def _prepare(x: Any, spec: ImageSpec, resized: bool) -> Any:
    """Images (N, C, H, W), pixel values / 255, not yet resized unless ``resized`` -> the
    model's channels and size, rescaled and normalised as ``spec`` says."""
    import torch

    x = _channels(x, spec.channels)
    if spec.do_resize and not resized:
        size, (top, left) = _resized_size(x.shape[-2], x.shape[-1], spec)
        x = _resize_tensor(x, size, spec.resample)
        x = x[..., top:top + spec.height, left:left + spec.width]
    factor = spec.rescale_factor * 255.0 if spec.do_rescale else 255.0
    if factor != 1.0:  # pixel values (0 .. 255) times rescale_factor
        x = x * factor
    x = x.contiguous()
    if spec.mean is not None and spec.std is not None:
        mean = torch.tensor(spec.mean, dtype=x.dtype)[: x.shape[1]].view(1, -1, 1, 1)
        std = torch.tensor(spec.std, dtype=x.dtype)[: x.shape[1]].view(1, -1, 1, 1)
        x = (x - mean) / std
    return x


def fit_image(x: Any, spec: ImageSpec) -> Any:
    """Images (N, C, H, W) in [0, 1] (a data set's) -> the model's input, as ``spec`` says."""
    return _prepare(x, spec, resized=False)


def fit_file_image(img: Any, spec: ImageSpec) -> Any:
    """A Pillow RGB image -> the model's input (1, C, H, W): resized and cropped on its 8-bit
    pixels by Pillow with spec's filter (as the Hugging Face processors do), then rescaled and
    normalised."""
    import numpy as np
    import torch

    if spec.do_resize:
        size, (top, left) = _resized_size(img.height, img.width, spec)
        if (img.height, img.width) != size:
            img = img.resize((size[1], size[0]), resample=spec.resample)
        img = img.crop((left, top, left + spec.width, top + spec.height))
    arr = np.asarray(img, dtype=np.float32) / 255.0
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).unsqueeze(0)
    return _prepare(x, spec, resized=True)


_SIXTEEN = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # how Pillow opens a 16-bit grey PNG


def read_image(path: str, notes: list[str]) -> tuple[Any, dict[str, Any]]:
    """The file as a Pillow RGB image (loaded) and what reading it did (for the input record);
    a note in ``notes`` for each change beyond decoding: a 16-bit image scaled to 8 bits, a
    transparent one composited onto white. An image larger than Pillow's decompression-bomb
    limit (``Image.MAX_IMAGE_PIXELS``) is refused."""
    import warnings

    p = Path(path)
    if not p.exists():
        raise InputError(f"argument --image: {path!r} does not exist")
    if not p.is_file():
        raise InputError(f"argument --image: {path!r} is not a file")
    try:
        import numpy as np
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError("argument --image: reading images needs Pillow, a dependency of "
                         "splitformer that does not import here (pip install pillow)") from None
    bomb = (Image.DecompressionBombWarning, Image.DecompressionBombError)
    info: dict[str, Any] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as img:
                if img.format not in ("PNG", "JPEG"):
                    raise InputError(f"argument --image: {path!r} is a {img.format} image; "
                                     "expected PNG or JPEG")
                info["mode"] = img.mode
                rawmode = img.tile[0][3] if img.tile and len(img.tile[0]) > 3 else None
                img.load()
                rgb = _to_rgb(img, info, rawmode, path, notes, np, Image)
    except InputError:
        raise
    except bomb as e:
        limit = Image.MAX_IMAGE_PIXELS
        found = re.search(r"\((\d+) pixels\)", str(e))
        size = f"{int(found.group(1))} pixels, " if found else ""
        raise InputError(f"argument --image: {path!r} is too large to read safely ({size}over "
                         f"Pillow's decompression-bomb limit of {limit} pixels); expected a "
                         "smaller image") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise InputError(f"argument --image: {path!r} is not a readable PNG or JPEG image "
                         f"({type(e).__name__})") from None
    return rgb, info


def _to_rgb(img: Any, info: dict[str, Any], rawmode: Any, path: str, notes: list[str], np: Any,
            Image: Any) -> Any:
    """A loaded image as 8-bit RGB: 16-bit grey scaled (value / 257, rounded), transparency
    composited onto white; ``info`` gets bits and transparency, ``notes`` a line for each."""
    bits = 16 if img.mode in _SIXTEEN or (isinstance(rawmode, str) and ";16" in rawmode) else 8
    info["bits"] = bits
    transparent = None
    if img.mode in _SIXTEEN:
        arr = np.asarray(img, dtype=np.float64)
        if "transparency" in img.info and isinstance(img.info["transparency"], int):
            transparent = arr == img.info["transparency"]
        grey = np.clip(np.rint(arr / 257.0), 0, 255).astype(np.uint8)
        img = Image.fromarray(grey, "L")
        notes.append(f"argument --image: {path!r} has 16 bits per pixel (grey): scaled to 8 "
                     "bits (value / 257, rounded), as the model's input is prepared from "
                     "8-bit pixels")
    elif bits == 16:
        notes.append(f"argument --image: {path!r} has 16 bits per channel: read as 8 bits "
                     "(Pillow keeps the high byte), as the model's input is prepared from "
                     "8-bit pixels")
    if transparent is None and (img.mode in ("RGBA", "LA", "PA", "RGBa", "La")
                                or "transparency" in img.info):
        rgba = img.convert("RGBA")
        alpha = np.asarray(rgba.getchannel("A"))
        transparent = alpha < 255
        if transparent.any():
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            img = Image.alpha_composite(white, rgba)
        else:
            img = rgba
    elif transparent is not None and transparent.any():
        arr = np.asarray(img).copy()
        arr[transparent] = 255
        img = Image.fromarray(arr, "L")
    composited = transparent is not None and bool(transparent.any())
    info["transparency"] = "composited onto white" if composited else None
    if composited:
        share = float(transparent.mean())
        notes.append(f"argument --image: {path!r} is transparent in places "
                     f"({share:.1%} of its pixels not opaque): composited onto a white "
                     "background")
    return img.convert("RGB")


def size_notes(width: int, height: int, spec: ImageSpec, flag: str) -> tuple[dict[str, Any],
                                                                                  list[str]]:
    """What resizing (and cropping) an image of width x height for ``spec`` does: record fields
    and notes (the aspect ratio changed; a part cropped away)."""
    if not spec.do_resize:
        return {"resized": False, "aspect_ratio_changed": False, "cropped": False}, []
    (h, w), _ = _resized_size(height, width, spec)
    changed = w * height != h * width
    cropped = (h, w) != (spec.height, spec.width)
    notes = []
    if changed:
        notes.append(f"argument {flag}: resized from {width}x{height} to {w}x{h} (aspect ratio "
                     "changed)")
    if cropped:
        notes.append(f"argument {flag}: resized to {w}x{h}, then the centre {spec.width}x"
                     f"{spec.height} cropped (as the model's image processor does)")
    return {"resized": (h, w) != (height, width), "aspect_ratio_changed": changed,
            "cropped": cropped}, notes


def preparation(spec: ImageSpec) -> dict[str, Any]:
    """How images were prepared, for the input record."""
    factor = spec.rescale_factor if spec.do_rescale else 1.0
    # rescale_factor multiplies 8-bit pixel values 0 .. 255 (1/255: the image in [0, 1]);
    # pixel_range says what the model is fed, before normalisation, so that the factor does
    # not read as a scaling of the image itself
    out = {"resample": RESAMPLE[spec.resample] if spec.do_resize else None,
           "rescale_factor": spec.rescale_factor if spec.do_rescale else None,
           "pixel_range": [0.0, round(255.0 * factor, 6)],
           "normalized": spec.mean is not None and spec.std is not None}
    if spec.config is not None or spec.defaults:  # a Hugging Face folder's processor
        out.update(preprocessor_config=spec.config, processor_defaults=spec.defaults)
    return out


def channel_note(x: Any, channels: int, flag: str) -> list[str]:
    """A note when fitting the channels of images ``x`` (N, C, H, W) to the model's loses
    something: colour to one channel (luminance), or a first channel repeated."""
    c = int(x.shape[1])
    if c == channels or c == 1:
        return []
    colour = not all(bool((x[:, k] == x[:, 0]).all()) for k in range(1, c))
    if not colour:
        return []
    if channels == 1:
        how = ("luminance 0.299 R + 0.587 G + 0.114 B" if c == 3 else
               f"the mean of its {c} channels")
        return [f"argument {flag}: the colour image{'s are' if x.shape[0] > 1 else ' is'} "
                f"converted to the model's one channel ({how})"]
    return [f"argument {flag}: the first of the image's {c} channels is repeated to the "
            f"model's {channels} channels"]


def image_prepared(sub: Subject, flag: str) -> list[str]:
    """The notes on how images are prepared for ``sub`` that do not depend on the image: the
    processor defaults a Hugging Face folder's preprocessor_config.json did not give."""
    spec = sub.image
    return [f"argument {flag}: {spec.defaults_note}"] if spec and spec.defaults_note else []

