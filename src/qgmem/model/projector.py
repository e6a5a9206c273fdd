"""Two-layer nonlinear projector from the pooled graph summary to one token in the LM's embedding space."""

from __future__ import annotations

import torch
from torch import nn


class GraphProjector(nn.Module):
    """``Linear → GELU → Linear``: the paper's two-layer nonlinear projector to the LM hidden size."""

    def __init__(self, in_dim: int, lm_hidden: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or max(in_dim, lm_hidden)
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, lm_hidden))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.net(pooled)

    @torch.no_grad()
    def match_scale(self, target_rms: float, sample: torch.Tensor) -> None:
        """Rescale the last layer so a fresh token has the RMS of the LM's word embeddings.

        A token far louder or quieter than the words around it either swamps attention or is ignored
        at the start of training; matching the scale once at init avoids both.
        """
        current = self(sample).pow(2).mean().sqrt().item()
        if current > 0 and target_rms > 0:
            self.net[-1].weight.mul_(target_rms / current)
            self.net[-1].bias.mul_(target_rms / current)
