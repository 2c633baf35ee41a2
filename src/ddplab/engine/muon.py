"""Muon: momentum whose update is orthogonalized, for convolution filters; Nesterov SGD for the rest.

A filter bank's gradient, viewed as a matrix (out channels x in*k*k), is dominated by a
few directions; Muon replaces the momentum matrix M = U S V^T by (approximately) U V^T,
so every direction moves at the same rate. The orthogonalization is a few steps of a
quintic Newton-Schulz iteration in bfloat16 on M scaled to unit Frobenius norm: cheap
matrix products instead of an SVD. Its singular values come out spread around 1 rather
than exactly 1, which does not hurt training.

torch.optim.Muon (torch 2.9+) takes 2-D parameters only and one rule for all of them;
ddplab's loop holds one optimizer per run, and a CNN also has filters (4-D), biases, norm
scales and a head that want plain momentum. So this one optimizer holds both kinds of
group, marked `orthogonalize`; on 2-D parameters its update is torch.optim.Muon's
(tested against it where the installed torch has it). Every operation accepts a learning
rate that is a device tensor, so a CUDA graph can capture the step.
"""

from __future__ import annotations

import math

import torch

# The quintic's coefficients (Jordan et al., 2024), chosen to push small singular values up fast.
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)
MOMENTUM_PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}  # the filters' momentum buffer (None: the weights')


def orthogonalize(m: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately U V^T of `m` = U S V^T, in bfloat16: one matrix (2-D), or a stack of matrices of one shape
    (3-D), each orthogonalized on its own in the same batched products."""
    a, b, c = NEWTON_SCHULZ
    x = m.bfloat16()
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    x = x / (x.norm() if x.dim() == 2 else x.norm(dim=(-2, -1), keepdim=True)).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def momentum_dtype(group: dict) -> torch.dtype | None:
    """A group's momentum buffer's dtype: the option's for the filters, the weights' own (None) for the rest."""
    return MOMENTUM_PRECISIONS[group["momentum_precision"]] if group["orthogonalize"] else None


def split_params(params) -> list[dict]:
    """Two groups: filters (4-D, trainable) orthogonalized; everything else plain momentum."""
    params = [p for p in params if p.requires_grad]
    filters = [p for p in params if p.dim() == 4]
    others = [p for p in params if p.dim() != 4]
    return [
        g
        for g in ({"params": filters, "orthogonalize": True}, {"params": others, "orthogonalize": False})
        if g["params"]
    ]


class Muon(torch.optim.Optimizer):
    """`lr` and `momentum` for the orthogonalized groups, `other_lr` and `other_momentum` for the rest
    (a group's own values win).

    Weight decay is decoupled on the filters, as in torch.optim.Muon, and L2 (added to the
    gradient before the momentum) on the rest, as in SGD. With `normalize`, each filter bank is
    rescaled to Frobenius norm sqrt(out channels) before its step: behind BatchNorm the scale
    of a filter changes nothing in the net's function, only how far a step of a given size
    turns it, so fixing the norm keeps the orthogonalized step (norm about sqrt(out channels)
    times the rate) the same fraction of the weights all run long (the CIFAR-10 speed records
    do this); weight decay on such a bank would be undone, so it gets none. `normalize_every` > 1
    rescales on the first step and every so many after it (the later records' saving): a count
    on the device decides, so a captured step keeps counting. `momentum_precision="bf16"` keeps
    the filters' momentum in bfloat16 (half its memory traffic; it is orthogonalized in
    bfloat16 either way).
    """

    def __init__(
        self,
        params,
        *,
        lr: float,
        other_lr: float,
        momentum: float = 0.9,
        other_momentum: float | None = None,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_steps: int = 5,
        normalize: bool = False,
        normalize_every: int = 1,
        momentum_precision: str = "fp32",
    ):
        if momentum_precision not in MOMENTUM_PRECISIONS:
            raise ValueError(f"momentum_precision: one of {', '.join(MOMENTUM_PRECISIONS)}, not {momentum_precision!r}")
        other_momentum = momentum if other_momentum is None else other_momentum
        groups = [
            {
                **g,
                "lr": g.get("lr", lr if g.get("orthogonalize") else other_lr),
                "momentum": g.get("momentum", momentum if g.get("orthogonalize") else other_momentum),
            }
            for g in params
        ]
        super().__init__(
            groups,
            dict(
                lr=lr,
                momentum=momentum,
                nesterov=nesterov,
                weight_decay=weight_decay,
                ns_steps=ns_steps,
                normalize=normalize,
                normalize_every=max(1, normalize_every),
                momentum_precision=momentum_precision,
                orthogonalize=False,
            ),
        )

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # a checkpoint written before the options existed
            group.setdefault("normalize", False)
            group.setdefault("normalize_every", 1)
            group.setdefault("momentum_precision", "fp32")

    def load_state_dict(self, state_dict: dict) -> None:
        """torch casts every loaded state tensor to its parameter's dtype: the filters' bfloat16 momentum and the
        counts are put back as they were saved (exactly: bfloat16 -> float32 -> bfloat16 loses nothing)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            dtype = momentum_dtype(group)
            for p in group["params"]:
                state = self.state.get(p, {})
                if dtype is not None and "momentum_buffer" in state:
                    state["momentum_buffer"] = state["momentum_buffer"].to(dtype)
                if "normalize_count" in state:
                    state["normalize_count"] = state["normalize_count"].to(torch.int64)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, decay, ortho = group["lr"], group["momentum"], group["weight_decay"], group["orthogonalize"]
            updates = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if ortho or not decay else p.grad.add(p, alpha=decay)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=momentum_dtype(group))
                buf = state["momentum_buffer"].mul_(momentum).add_(grad)
                updates[p] = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            if ortho:
                updates = self._orthogonalized(updates, group["ns_steps"])
            for p, update in updates.items():
                if ortho:
                    if group["normalize"]:
                        self._normalize(p, group["normalize_every"])
                    elif decay:
                        p.mul_(1 - lr * decay)
                p.sub_(update * lr)  # works for a float and a device-tensor rate alike
        return loss

    def _normalize(self, p: torch.Tensor, every: int) -> None:
        """The bank rescaled to norm sqrt(out channels): each step, or on the steps the bank's count on the device
        says (the first, then one in `every`)."""
        scale = math.sqrt(p.shape[0]) / p.norm().clamp(min=1e-12)
        if every > 1:
            state = self.state[p]
            if "normalize_count" not in state:
                state["normalize_count"] = torch.zeros((), dtype=torch.int64, device=p.device)
            count = state["normalize_count"]
            scale = torch.where(count % every == 0, scale, torch.ones_like(scale))
            count.add_(1)
        p.mul_(scale)

    @staticmethod
    def _orthogonalized(updates: dict, steps: int) -> dict:
        """Each filter bank's update orthogonalized as a (out channels x in*k*k) matrix, scaled by
        sqrt(max(1, rows / cols)); the banks of one shape together, in one batched Newton-Schulz (a per-bank
        loop was 37% of the speedrun's eager step on an H100)."""
        by_shape: dict[tuple[int, int], list] = {}
        for p in updates:
            by_shape.setdefault((p.shape[0], p[0].numel()), []).append(p)
        out = {}
        for (rows, cols), params in by_shape.items():
            stacked = torch.stack([updates[p].reshape(rows, cols) for p in params])
            done = orthogonalize(stacked if len(params) > 1 else stacked[0], steps)
            scale = math.sqrt(max(1.0, rows / cols))
            for p, u in zip(params, done if len(params) > 1 else [done], strict=True):
                out[p] = u.view_as(p).to(p.dtype) * scale
        return {p: out[p] for p in updates}  # the parameters' own order
