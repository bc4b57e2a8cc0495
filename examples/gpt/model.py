"""A GPT decoder in the shape of nanoGPT's ``model.py``, laid out for tensor parallelism.

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384))
    logits, loss = model(idx, targets)           # idx, targets: (batch, time) token ids
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3,
                                           betas=(0.9, 0.95), device_type="cuda")

It differs from nanoGPT's model in one place: the attention has separate ``q_proj``,
``k_proj`` and ``v_proj`` Linears instead of one fused ``c_attn``. Tensor parallelism splits
q, k and v column-wise so that each rank holds whole heads; a fused projection split the same
way would give a rank a slice of q followed by slices of k and v that do not line up.
:func:`tp_plan` names the layers to split. Parameter names are otherwise nanoGPT's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import paratrain as pt


@dataclass(kw_only=True)
class GPTConfig:
    """The model's shape (the values a checkpoint must agree on) and its dropout."""

    block_size: int = 256
    """Longest context in tokens (the number of position embeddings)."""
    vocab_size: int = 65
    """Number of token ids; the token embedding and the output layer share this many rows."""
    n_layer: int = 6
    """Transformer blocks."""
    n_head: int = 6
    """Attention heads per block; ``n_embd`` must be a multiple, and tp must divide it."""
    n_embd: int = 384
    """Width of the residual stream."""
    dropout: float = 0.0
    """Dropout on attention weights, residual branches and embeddings (0 for pretraining)."""
    bias: bool = True
    """Bias in the Linears and LayerNorms, as in GPT-2."""


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with ``F.scaled_dot_product_attention``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(
                f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}: each head "
                "needs n_embd / n_head features. Choose n_embd = n_head x head size."
            )
        self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.k_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.v_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # Under tensor parallelism paratrain divides n_head by the tp size; the head size
        # stays, so the forward reshapes with both and never with n_embd.
        self.n_head = config.n_head
        self.head_size = config.n_embd // config.n_head
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        shape = (B, T, self.n_head, self.head_size)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # (B, heads, T, head size)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_size)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Linear to 4 x width, GELU, Linear back."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: attention and MLP, each on a residual branch."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, a final LayerNorm, and an output
    layer that shares its weight with the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "wpe": nn.Embedding(config.block_size, config.n_embd),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                "ln_f": nn.LayerNorm(config.n_embd, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that add to the residual stream
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, each tied one once; without the position embeddings by default."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position, and the mean cross-entropy when ``targets`` are given.
        Without targets only the last position's logits are computed (for sampling)."""
        t = idx.size(1)
        if t > self.config.block_size:
            raise ValueError(f"sequence of {t} tokens, but block_size is {self.config.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def configure_optimizers(
        self,
        *,
        weight_decay: float,
        learning_rate: float,
        betas: tuple[float, float],
        device_type: str = "cpu",
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on the 2-D parameters (matmul weights, embeddings) only;
        biases and LayerNorm weights are not decayed. ``device_type`` is where training will
        run (the parameters may not be there yet): on ``cuda`` the fused kernel is used."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = True if device_type == "cuda" else None
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self) -> int:
        """Forward and backward FLOPs per token at full context (PaLM, appendix B)."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` (batch, time) by ``max_new_tokens`` sampled tokens."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size :])
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), 1)), dim=1)
        return idx


def tp_plan() -> pt.tp.TPPlan:
    """The layers of :class:`GPT` to split over the ``tp`` axis: q, k, v and the MLP's first
    Linear column-wise, both ``c_proj`` row-wise; ``n_head`` becomes the heads per rank.

    The embeddings and the output layer stay whole on every rank: the output layer shares its
    weight with the token embedding, and splitting one would untie them."""
    attention = pt.tp.attention(
        "transformer.h.*.attn", q="q_proj", k="k_proj", v="v_proj", out="c_proj", heads=("n_head",)
    )
    return attention | pt.tp.mlp("transformer.h.*.mlp", up="c_fc", down="c_proj")
