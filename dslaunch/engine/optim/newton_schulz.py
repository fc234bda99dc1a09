"""Newton-Schulz orthogonalization, the arithmetic of Muon's update (``muon.py``; its ZeRO
path ``muon_zero.py``): the coefficients, the iteration in the "gram" and "standard" forms, the
dtype it runs in, and the momentum update it orthogonalizes."""

from __future__ import annotations

import torch

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_METHODS = ("gram", "standard")
NS_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
             "fp64": torch.float64}


def ns_dtype(method: str, device: torch.device, choice: str = "auto") -> torch.dtype:
    """The dtype the iteration runs in (DeepSpeed's rule under "auto")."""
    if choice != "auto":
        return NS_DTYPES[choice]
    if device.type == "cuda":
        if method == "gram":
            return torch.float16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if method == "gram":
        try:
            fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except Exception:
            fp16 = False
        return torch.float16 if fp16 else torch.float32
    return torch.bfloat16  # DeepSpeed's CPU accelerator reports bf16 support everywhere


def _normalized(G: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """G (rows <= cols after a transpose) scaled to Frobenius norm ~1, then cast: normalizing
    first keeps an fp16 cast from overflowing."""
    X = G.float() if G.dtype == torch.float16 else G
    X = X / (torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True) + 1e-7)
    return X.to(dtype)


def newton_schulz(G: torch.Tensor, steps: int = 5, method: str = "gram",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """NS_steps(G) for a matrix or a batch of matrices (last two dims), in ``dtype``."""
    if G.ndim < 2:
        raise ValueError(f"Newton-Schulz needs a matrix, got shape {tuple(G.shape)}")
    if method not in NS_METHODS:
        raise ValueError(f"ns_method must be one of {NS_METHODS}, got {method!r}")
    a, b, c = NS_COEFFS
    tall = G.size(-2) > G.size(-1)
    X = _normalized(G.mT if tall else G, dtype)
    rows, cols = X.size(-2), X.size(-1)
    if method == "standard" or cols <= rows:
        for _ in range(steps):
            A = X @ X.mT
            X = torch.baddbmm(X, torch.baddbmm(A, A, A, beta=b, alpha=c), X, beta=a) \
                if X.ndim == 3 else torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
    else:
        X = _gram_iterations(X, steps, a, b, c)
    return X.mT if tall else X


def _gram_iterations(X, steps, a, b, c, restart: int = 2):
    """The quintic iteration carried by the Gram matrix: with Z = b R + c R^2 the update is
    X <- (a I + Z) X, so R <- (a I + Z) R (a I + Z) and the product of the (a I + Z) factors
    is kept as Q; X itself is touched at the restart and at the end only."""
    eye = torch.eye(X.size(-2), dtype=X.dtype, device=X.device)
    R, Q = X @ X.mT, None
    for i in range(steps):
        if i == restart:
            X = Q @ X
            R, Q = X @ X.mT, None
        Z = b * R + c * (R @ R)
        Q = Z + a * eye if Q is None else a * Q + Z @ Q
        if i < steps - 1 and i + 1 != restart:
            RZ = a * R + Z @ R
            R = a * RZ + Z @ RZ
    return Q @ X


def orthogonalize(update: torch.Tensor, *, steps: int = 5, method: str = "gram",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """NS(update) times DeepSpeed's shape scale, in ``update``'s dtype and shape."""
    shape = update.shape
    scale = max(1.0, shape[-2] / shape[-1]) ** 0.5  # 4-D: DeepSpeed reads the last two dims
    mat = update.reshape(shape[0], -1) if update.ndim == 4 else update
    out = newton_schulz(mat, steps, method, dtype) * scale
    return out.to(update.dtype).reshape(shape)


def momentum_update_(grad: torch.Tensor, buf: torch.Tensor, beta: float, nesterov: bool):
    """M <- lerp(M, G, 1 - beta); returns the (nesterov) update before orthogonalization.
    Elementwise, so it runs on ZeRO shards as well as on whole matrices."""
    buf.lerp_(grad, 1 - beta)
    return torch.lerp(grad, buf, beta) if nesterov else buf.clone()


# -- the optimizer -------------------------------------------------------------------------------
