"""The losses a training step minimises (the ``objective`` part of :mod:`ropekit.train.loop`).

* :class:`TokenMeanLoss` (fine-tuning, :mod:`ropekit.train.trainer`): the mean next-token cross-entropy over
  **all label tokens of the global batch**. The label-token count ``N`` is summed over processes first, each
  micro-batch backpropagates ``sum of its token losses × P / N`` (``P`` processes; DDP averages gradients over
  processes, which cancels ``P``), so 1 process × accumulation 2 and 2 processes × accumulation 1 compute the
  same gradient, and a padded or masked token never weighs more than another.
* :class:`BatchMeanLoss` (pre-training from scratch, :mod:`ropekit.train.pretrain`): transformers' own
  ``labels=`` loss of one batch, the mean cross-entropy of its predicted tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..install import installed
from ..methods import get_method
from .data import document_varlen_kwargs, model_attention_mask
from .lora import base_model


def _targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The next-token labels of ``batch``'s positions that have one."""
    return batch["targets"] if "targets" in batch else batch["labels"][:, 1:]


def token_loss_sum(model, unwrapped, param_dtype: torch.dtype, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of next-token cross-entropies over the label tokens of ``batch`` (float32); ``model`` is what runs
    (wrapped by the strategy), ``unwrapped`` the model whose method and attention mask form apply."""
    record = installed(base_model(unwrapped))
    if record:  # the method's own form of a training batch (Landmark inserts its tokens)
        batch = get_method(record["method"]).training_batch(batch, record["params"])
    mask = model_attention_mask(batch["attention_mask"], base_model(unwrapped), param_dtype, batch["position_ids"])
    varlen = document_varlen_kwargs(batch["attention_mask"], base_model(unwrapped), batch["position_ids"])
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask, use_cache=False,
                **varlen)
    if "targets" in batch:  # a context-parallel shard: shifted over the whole sequence before the split
        logits, targets = out.logits, batch["targets"]
    else:
        logits, targets = out.logits[:, :-1], batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=-100, reduction="sum")


class TokenMeanLoss:
    """The mean next-token loss over every label token of the global batch (see the module's docstring)."""

    def __init__(self, model, unwrapped, strategy, param_dtype: torch.dtype, device: torch.device):
        self.model, self.unwrapped, self.strategy = model, unwrapped, strategy
        self.param_dtype = param_dtype
        self.device = device

    def __call__(self, micro: list[dict[str, torch.Tensor]]) -> tuple[float, int, int]:
        strategy, device = self.strategy, self.device
        micro = strategy.place(micro)
        wide = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        counts = torch.tensor(
            [sum(int((_targets(b) != -100).sum()) for b in micro), sum(b["input_ids"].numel() for b in micro)],
            device=device, dtype=torch.int64)
        n_labels, n_tokens = (int(x) for x in strategy.reduce_sum(counts).tolist())
        loss_sum = torch.zeros((), device=device, dtype=wide)
        if n_labels > 0:
            scale = strategy.world / n_labels
            for j, batch in enumerate(micro):
                with strategy.accumulate(self.model, last=j == len(micro) - 1):
                    token_loss = token_loss_sum(self.model, self.unwrapped, self.param_dtype, batch)
                    strategy.backward(self.model, token_loss * scale)
                loss_sum += token_loss.detach().to(wide)
        loss = float(strategy.reduce_sum(loss_sum)) / n_labels if n_labels > 0 else float("nan")
        return loss, n_labels, n_tokens


class BatchMeanLoss:
    """transformers' ``labels=`` loss of a single batch ``{"input_ids", "attention_mask" (may be None)}``: the
    batch is its own label sequence, so every position but each row's last is predicted."""

    def __init__(self, model, strategy):
        self.model, self.strategy = model, strategy

    def __call__(self, micro: list[dict[str, torch.Tensor]]) -> tuple[float, int, int]:
        (batch,) = micro
        ids = batch["input_ids"]
        loss = self.model(input_ids=ids, attention_mask=batch.get("attention_mask"), labels=ids).loss
        self.strategy.backward(self.model, loss)
        return loss.item(), ids.shape[0] * (ids.shape[1] - 1), ids.numel()
