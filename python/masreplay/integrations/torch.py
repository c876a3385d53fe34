"""PyTorch glue: per-row advantages spread over the generated tokens of each row.

torch is optional: numpy inputs work without it; torch tensors need it (installed with
``pip install torch``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from masreplay.errors import InvalidArgumentError


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def expand_to_tokens(per_row: Any, response_mask: Any) -> Any:
    """``(rows,)`` advantages -> ``(rows, L)``: each row's advantage on every generated token
    (``response_mask`` 1, or True) and 0 elsewhere (prompt, tool output, padding), as verl's
    outcome estimators return ``A.unsqueeze(-1) * response_mask``. Tensors in, a tensor out
    (on the mask's device, in the advantages' floating dtype); numpy in, numpy out.
    """
    if _is_tensor(per_row) or _is_tensor(response_mask):
        try:
            import torch
        except ImportError as error:  # pragma: no cover - a tensor implies torch
            raise ImportError("expand_to_tokens with tensors needs the 'torch' package") from error
        mask = torch.as_tensor(response_mask)
        values = torch.as_tensor(per_row, device=mask.device)
        if not values.is_floating_point():
            values = values.to(torch.float32)
        _check(tuple(values.shape), tuple(mask.shape))
        return values.unsqueeze(-1) * mask.to(values.dtype)
    values = np.asarray(per_row)
    mask = np.asarray(response_mask)
    if values.dtype.kind != "f":
        values = values.astype(np.float32)
    _check(values.shape, mask.shape)
    return values[:, None] * mask.astype(values.dtype)


def _check(values: tuple, mask: tuple) -> None:
    if len(values) != 1 or len(mask) != 2 or values[0] != mask[0]:
        raise InvalidArgumentError(f"expand_to_tokens needs per_row (rows,) and response_mask (rows, L); got {values} and {mask}")
