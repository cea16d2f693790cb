"""CLEX's learned frequency dynamics: the ODE, its fixed-step integrator, and the module that turns it into cos/sin.

CLEX (Chen et al. 2024, ICLR, arXiv 2310.16450, §3; docs/methods-reference.md §7) makes the RoPE frequencies a continuous
function of the scale ``t = L'/C`` (``C`` the pretrained window, ``L'`` the length to serve). The state is the
log of the frequency basis, ``z(t) = log θ(t) ∈ R^{d/2}``, with ``z(1) = log θ`` (plain RoPE), and it evolves by

    dz/dt = g_φ(z, t) = W_down · σ(W_up · (z + log ξ(t))) + ∂_t log ξ(t)                         (CLEX ODE)

* ``ξ(t)`` is the NTK-aware frequency basis at ``α = 2t − 1``: ``log ξ_i(t) = −(2i/d)·ln b − (2i/(d−2))·ln α``
  (LCEG Eq. 9 with that α); its time derivative ``∂_t log ξ_i = −(4i/(d−2))/(2t − 1)`` is CLEX's time
  embedding, and ``log ξ(t)`` is added to the network's input so that the learned part sees the time too.
* ``W_up ∈ R^{(d/2)×(p·d)}``, ``W_down ∈ R^{(p·d)×(d/2)}`` with ``p`` the "param_factor" (amplification) and ``σ``
  tanh or SiLU; no biases. ``W_down`` starts at zero, so the untrained ODE is ``dz/dt = ∂_t log ξ(t)``, whose
  solution is exactly NTK-aware scaling with ``α = 2t − 1`` — the learned part is a correction to it.
  ``W_up`` starts uniform in ``±1/√(p·d)`` (the reference's Kaiming-uniform bound for that matrix).
* The reference code calls the time embedding with ``b = 10000`` whatever the model's base; here the
  model's own ``rope_theta`` is used (the derivative term does not depend on ``b``; only the network's input
  shift does, so the two agree on every 10,000-base model).

Integration: classical fourth-order Runge–Kutta with the fixed step ``time_dt`` (the reference: torchdiffeq's
``rk4`` with ``step_size = 0.01``, which takes Kutta's 3/8-rule step — also fourth order; the two differ by
``O(dt^5)`` per step). A target ``t`` that is not on the grid ``1, 1 + dt, 1 + 2dt, …`` is reached by a last,
shortened step, so ``z(t)`` is continuous in ``t``. The state is integrated in float64 (the reference: float32,
whose rounding over 1,500 steps reaches ~1e-5 of a frequency) and the frequencies returned in float32.
torchdiffeq is not a dependency.

:class:`CLEXFrequencies` holds ``W_up``/``W_down``; it is attached to the model's rotary-embedding module (as
``rotary_emb.clex``, so the weights are in ``state_dict`` and in saved checkpoints) and replaces that module's
cos/sin through a forward hook. What it returns depends on the mode:

* **Inference** (eval mode, or train mode without a sampled scale): ``t`` from the input length ``n`` —
  ``max(1, n/C)`` (``inference_scale='continuous'``, the default: frequencies are a continuous function of the
  length) or ``⌈n/C⌉`` (``'ceil'``, the reference code), capped at ``max_factor``. ``n`` is taken **per batch
  row**, as that row's largest position + 1 (with padding numbered ``cumsum(mask) − 1``, as ``generate`` does,
  this is the row's own length; in a cached decode step, whose positions are only the new ones, it is the
  length so far), and each row gets ``cos``/``sin`` at its own ``t`` — so a row's output does not depend on its
  batch-mates, and a row of at most ``C`` tokens gets the rotary module's own frequencies untouched
  (bit-identical to the plain model) even beside a long row. (The reference code takes one ``t`` per call, from
  the key length of the whole batch.) Rows sharing a ``t`` share one evaluation of the ODE; the trajectory on
  the whole grid ``[1, max_factor]`` is computed once and cached until the weights change.
* **Training** (train mode after :meth:`CLEXFrequencies.set_training_scale`): CLEX's position-extrapolation
  training (§3.3; reference ``sample_random_times`` / ``get_random_position_ids``): a scale ``t ∈ {1 … t_max}``
  is drawn per step, the frequencies are ``exp z(t)`` integrated *with* gradients, and the ``n`` positions are
  ``0``, a sorted random sample of ``n − 2`` distinct integers from ``1 … n·t − 2``, and ``n·t − 1`` — so a
  short training sequence covers the span ``n·t``. (When ``n`` exceeds ``C`` the reference divides the
  positions by ``s = ⌊n/C⌋``; so does this.) Position ``p`` of the batch is moved to the ``p``-th sampled one.

**Cached decoding past the window differs from CLEX's reference.** The reference code (DAMO-NLP-SG/CLEX,
``CLEX/llama/modeling_llama_clex.py``, ``LlamaAttention.forward``: "Update KV cache before RoPE") caches keys
*before* the rotation and rotates every cached key with the current step's frequencies, so its cached decoding
equals a full forward of the same tokens. Here CLEX only replaces the rotary module's ``cos``/``sin``; the
model's attention rotates the new keys and caches them rotated, and the rotary module cannot reach the cache.
So a key keeps the rotation of the scale ``t`` of the call that cached it, and a decode step whose ``t``
differs from the ``t`` at which earlier keys were cached gives (slightly) different logits from a full
forward — as with transformers' dynamic NTK (transformers #25104). In ``'continuous'`` mode ``t`` changes at
every length past ``C``; in ``'ceil'`` mode only when the length crosses a multiple of ``C``, and decode steps
between two crossings equal a full forward. The first call that continues a cache (its positions start at
``p0 > 0``) with a row whose ``t`` differs from the scale at length ``p0`` warns once per process
(:func:`warn_stale_cached_keys`); for logits exactly as CLEX defines them at every length, run full forwards
(``use_cache=False``) — or use ``'ceil'`` and accept the difference only after each crossing.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"tanh": torch.tanh, "silu": F.silu}


def rk4_step(f: Callable[[float, torch.Tensor], torch.Tensor], t: float, z: torch.Tensor, h: float) -> torch.Tensor:
    """One classical Runge–Kutta step of size ``h`` for ``dz/dt = f(t, z)`` from ``(t, z)``."""
    k1 = f(t, z)
    k2 = f(t + h / 2, torch.add(z, k1, alpha=h / 2))
    k3 = f(t + h / 2, torch.add(z, k2, alpha=h / 2))
    k4 = f(t + h, torch.add(z, k3, alpha=h))
    # z + h/6·(k1 + 2k2 + 2k3 + k4), as fused adds: the integrator runs hundreds of steps per call
    return torch.add(z, torch.add(torch.add(torch.add(k1, k2, alpha=2.0), k3, alpha=2.0), k4), alpha=h / 6)


def grid_steps(t: float, dt: float) -> tuple[int, float]:
    """``(k, h)``: ``t = 1 + k·dt + h`` with ``0 ≤ h < dt`` (``h = 0`` on the grid, up to rounding)."""
    k = math.floor((t - 1.0) / dt + 1e-9)
    h = t - grid_time(k, dt)
    return k, (0.0 if abs(h) <= 1e-9 * dt else h)


def grid_time(k: int, dt: float) -> float:
    """The ``k``-th grid time ``1 + k·dt`` (one formula, so every path steps through the same times)."""
    return 1.0 + k * dt


def scale_for_length(length: int, window: int, max_factor: int, rule: str = "continuous") -> float:
    """CLEX's inference scale for an input of ``length`` tokens: ``max(1, n/C)`` or ``⌈n/C⌉``, capped at t_max."""
    if length <= window:
        return 1.0
    t = length / window if rule == "continuous" else float(math.ceil(length / window))
    return min(t, float(max_factor))


#: Whether :func:`warn_stale_cached_keys` has spoken in this process (it speaks once).
_STALE_KEYS_WARNED = False


def warn_stale_cached_keys(start: int, length: int, before: float, now: float) -> None:
    """Say once per process that a call continuing a KV cache runs at a scale its cached keys were not rotated at.

    ``start`` is the row's first position (the cache length before the call), ``length`` its length now, and
    ``before``/``now`` the scales at those lengths (module doc: cached decoding past the window).
    """
    global _STALE_KEYS_WARNED
    if _STALE_KEYS_WARNED:
        return
    _STALE_KEYS_WARNED = True
    warnings.warn(
        f"clex: cached decoding at length {length} runs at scale t = {now:.4g} while the keys already cached were "
        f"rotated at t ≤ {before:.4g} (the KV cache holds rotated keys), so its logits differ from a full forward; "
        "CLEX's reference code re-rotates every cached key at the current t — for that, generate without the cache "
        "(use_cache=False), or use inference_scale='ceil' (t changes only at multiples of the window)",
        stacklevel=2,
    )


def sample_training_positions(length: int, scale: int, window: int, generator: torch.Generator) -> torch.Tensor:
    """CLEX's training positions for ``length`` tokens at scale ``t`` (float32, increasing; see the module doc).

    ``0``, ``n − 2`` sorted distinct draws from ``1 … n·t − 2``, and ``n·t − 1``, all divided by
    ``s = max(1, ⌊n/C⌋)`` except the last, which is ``⌊n·t/s⌋ − 1`` (the reference's formula).
    """
    n = int(length)
    if n < 2:
        return torch.arange(n, dtype=torch.float32)
    s = max(1, n // window)
    span = n * int(scale)
    inner = torch.randperm(span - 2, generator=generator)[: n - 2].sort().values.to(torch.float32) + 1.0
    first = torch.zeros(1, dtype=torch.float32)
    last = torch.tensor([float(span // s - 1)], dtype=torch.float32)
    return torch.cat([first, inner / s, last])


class CLEXFrequencies(nn.Module):
    """The learned dynamics ``g_φ`` of CLEX and the frequencies they give (module doc).

    ``dim`` is the rotary dimension ``d``, ``rope_theta`` the base ``b`` and ``window`` the pretrained ``C``.
    ``forward(x, position_ids, base_inv_freq)`` returns ``(cos, sin)`` shaped like transformers' rotary
    embeddings, from the rotary module's own inverse frequencies ``θ`` (``z(1) = log θ``).
    """

    def __init__(self, dim: int, *, rope_theta: float, window: int, max_factor: int, time_dt: float,
                 param_factor: int, act: str, inference_scale: str = "continuous", init_seed: int = 0,
                 device: torch.device | str | None = None):
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {act!r}")
        half, hidden = dim // 2, param_factor * dim
        self.dim, self.rope_theta, self.window = int(dim), float(rope_theta), int(window)
        self.max_factor, self.time_dt, self.act = int(max_factor), float(time_dt), act
        self.inference_scale = inference_scale
        generator = torch.Generator().manual_seed(int(init_seed))  # the caller's RNG stays untouched
        bound = 1.0 / math.sqrt(hidden)
        up = (torch.rand(half, hidden, generator=generator, dtype=torch.float32) * 2 - 1) * bound
        self.up_proj = nn.Parameter(up.to(device))
        self.down_proj = nn.Parameter(torch.zeros(hidden, half, dtype=torch.float32, device=device))
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._grid: tuple[tuple, torch.Tensor] | None = None
        self._train_scale: int | None = None
        self._train_seed = 0
        self._train_draws = 0

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, max_factor={self.max_factor}, time_dt={self.time_dt}, act={self.act}, "
                f"hidden={self.up_proj.shape[1]}, inference_scale={self.inference_scale}")

    # ---- the ODE ---------------------------------------------------------------------------------------
    def _ntk_terms(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``((2i/d)·ln b, 2i/(d−2))`` for ``i = 0 … d/2−1``, the two parts of ``log ξ(t)``."""
        key = (device, dtype)
        if key not in self._constants:
            two_i = torch.arange(0, self.dim, 2, dtype=torch.float64)
            base_term = two_i / self.dim * math.log(self.rope_theta)
            alpha_exponent = two_i / (self.dim - 2)
            self._constants[key] = (base_term.to(device, dtype), alpha_exponent.to(device, dtype))
        return self._constants[key]

    def vector_field(self, dtype: torch.dtype, device: torch.device) -> Callable[[float, torch.Tensor], torch.Tensor]:
        """``g_φ(t, z) = W_down·σ(W_up·(z + log ξ(t))) + ∂_t log ξ(t)`` with ``α = 2t − 1`` (the CLEX ODE).

        The weights are cast to ``dtype`` once here, not at every evaluation (four per RK4 step).
        """
        base_term, alpha_exponent = self._ntk_terms(device, dtype)
        neg_base, neg_exponent = -base_term, -alpha_exponent
        up, down_t = self.up_proj.to(dtype), self.down_proj.to(dtype).t()
        act = ACTIVATIONS[self.act]

        def field(t: float, z: torch.Tensor) -> torch.Tensor:
            alpha = 2.0 * t - 1.0
            log_ntk = torch.add(neg_base, neg_exponent, alpha=math.log(alpha))  # log ξ(t)
            ntk_rate = neg_exponent * (2.0 / alpha)  # ∂_t log ξ(t) = −(2i/(d−2))·2/α
            return torch.addmv(ntk_rate, down_t, act(torch.add(z, log_ntk) @ up))

        return field

    def velocity(self, t: float, z: torch.Tensor) -> torch.Tensor:
        """``dz/dt`` at ``(t, z)`` (:meth:`vector_field`)."""
        return self.vector_field(z.dtype, z.device)(t, z)

    @staticmethod
    def initial_state(base_inv_freq: torch.Tensor) -> torch.Tensor:
        """``z(1) = log θ`` in float64 (float32 on MPS, which has none): hundreds of steps would otherwise
        accumulate float32 rounding to ~1e-5 of the frequencies."""
        dtype = torch.float32 if base_inv_freq.device.type == "mps" else torch.float64
        return torch.log(base_inv_freq.to(dtype))

    def log_inv_freq(self, t: float, base_inv_freq: torch.Tensor) -> torch.Tensor:
        """``z(t)`` integrated from ``z(1) = log θ`` (differentiable in the weights): grid steps, then one short step."""
        z = self.initial_state(base_inv_freq)
        field = self.vector_field(z.dtype, z.device)
        k, h = grid_steps(t, self.time_dt)
        for j in range(k):
            z = rk4_step(field, grid_time(j, self.time_dt), z, self.time_dt)
        return rk4_step(field, grid_time(k, self.time_dt), z, h) if h > 0 else z

    def _cache_key(self, base_inv_freq: torch.Tensor) -> tuple:
        tensors = (base_inv_freq, self.up_proj, self.down_proj)
        # `_version` counts in-place writes (optimizer steps, load_state_dict), data_ptr catches .to(device)
        return tuple((x.data_ptr(), x._version, x.device, x.dtype) for x in tensors)

    @torch.no_grad()
    def trajectory(self, base_inv_freq: torch.Tensor) -> torch.Tensor:
        """``z`` at every grid time ``1, 1 + dt, …`` up to ``max_factor`` — shape (K + 1, d/2), cached."""
        key = self._cache_key(base_inv_freq)
        if self._grid is None or self._grid[0] != key:
            last, _ = grid_steps(float(self.max_factor), self.time_dt)
            states = [self.initial_state(base_inv_freq)]
            field = self.vector_field(states[0].dtype, states[0].device)
            for k in range(last):
                states.append(rk4_step(field, grid_time(k, self.time_dt), states[-1], self.time_dt))
            self._grid = (key, torch.stack(states))
        return self._grid[1]

    @torch.no_grad()
    def cached_log_inv_freq(self, t: float, base_inv_freq: torch.Tensor) -> torch.Tensor:
        """``z(t)`` from the cached trajectory: the grid state below ``t`` and one short step (same arithmetic
        as :meth:`log_inv_freq`, without gradients)."""
        states = self.trajectory(base_inv_freq)
        k, h = grid_steps(t, self.time_dt)
        z = states[k]
        return rk4_step(self.vector_field(z.dtype, z.device), grid_time(k, self.time_dt), z, h) if h > 0 else z

    # ---- training state --------------------------------------------------------------------------------
    def set_training_scale(self, scale: int, seed: int) -> None:
        """Use scale ``t`` and positions drawn from ``seed`` for the train-mode forwards until the next call."""
        if not 1 <= int(scale) <= self.max_factor:
            raise ValueError(f"training scale {scale} outside 1 … {self.max_factor}")
        self._train_scale, self._train_seed, self._train_draws = int(scale), int(seed), 0

    def clear_training_scale(self) -> None:
        self._train_scale = None

    @property
    def training_scale(self) -> int | None:
        return self._train_scale

    # ---- cos / sin -------------------------------------------------------------------------------------
    def length_scale(self, length: int) -> float:
        """The inference scale ``t`` of an input of ``length`` tokens under this module's rule (module doc)."""
        return scale_for_length(length, self.window, self.max_factor, self.inference_scale)

    def inv_freq_for_length(self, length: int, base_inv_freq: torch.Tensor) -> torch.Tensor:
        """The inference frequencies ``exp z(t)`` for an input of ``length`` tokens (``θ`` itself inside the window)."""
        return self.inv_freq_at(self.length_scale(length), base_inv_freq)

    def inv_freq_at(self, t: float, base_inv_freq: torch.Tensor) -> torch.Tensor:
        """The inference frequencies ``exp z(t)`` at scale ``t`` (``θ`` itself at ``t = 1``)."""
        if t == 1.0:
            return base_inv_freq.float()
        if torch.is_grad_enabled() and self.training:
            return torch.exp(self.log_inv_freq(t, base_inv_freq)).float()
        return torch.exp(self.cached_log_inv_freq(t, base_inv_freq)).float()

    def _training_inputs(self, length: int, base_inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inv_freq, positions)`` of a training forward at the sampled scale."""
        t = self._train_scale
        generator = torch.Generator().manual_seed(self._train_seed + 1_000_003 * self._train_draws)
        self._train_draws += 1  # each micro-batch of a step draws its own positions
        positions = sample_training_positions(length, t, self.window, generator)
        if t == 1:
            # z(1) = log θ takes no step; the zero term keeps the weights in the graph, so that DDP without
            # find_unused_parameters does not wait for their gradients forever
            anchor = 0.0 * (self.up_proj.sum() + self.down_proj.sum())
            return base_inv_freq.float() + anchor.float(), positions
        return torch.exp(self.log_inv_freq(float(t), base_inv_freq)).float(), positions

    def row_inv_freq(self, position_ids: torch.Tensor, base_inv_freq: torch.Tensor) -> torch.Tensor:
        """Inference frequencies per row of ``position_ids``: shape ``(*rows, d/2)``, or ``(d/2,)`` when every row
        has the same ``t``. A row's length is its largest position + 1 (module doc); rows sharing a ``t`` share
        one evaluation of the ODE. Warns once when a call continuing a cache changes a row's scale."""
        if position_ids.ndim == 0 or position_ids.numel() == 0:
            return self.inv_freq_at(1.0, base_inv_freq)
        # one host sync for all rows (as the single batch maximum took before); shapes stay static
        ends = position_ids.amax(dim=-1)
        starts = position_ids.amin(dim=-1)
        pairs = torch.stack([starts.flatten(), ends.flatten()], dim=-1).tolist()
        scales = [self.length_scale(int(end) + 1) for _, end in pairs]
        if not torch.compiler.is_compiling():
            for (start, end), t in zip(pairs, scales):
                # a call whose positions start at p0 > 0 continues a cache of p0 positions; the key at p0 − 1 was
                # cached by a call of length p0, so at the scale of length p0
                if start > 0 and self.length_scale(int(start)) != t:
                    warn_stale_cached_keys(int(start), int(end) + 1, self.length_scale(int(start)), t)
                    break
        by_scale = {t: self.inv_freq_at(t, base_inv_freq) for t in dict.fromkeys(scales)}
        if len(by_scale) == 1:
            return next(iter(by_scale.values()))
        rows = torch.stack([by_scale[t] for t in scales])
        return rows.reshape(*ends.shape, rows.shape[-1])

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, base_inv_freq: torch.Tensor,
                attention_scaling: float = 1.0):
        device = x.device
        with torch.autocast(device_type=device.type, enabled=False):
            positions = position_ids.float()
            if self.training and self._train_scale is not None:
                # the step's sampled scale applies to every row (CLEX §3.3), over the batch's length
                length = int(position_ids.max()) + 1
                inv_freq, table = self._training_inputs(length, base_inv_freq)
                positions = table.to(device)[position_ids.long()]
            else:
                inv_freq = self.row_inv_freq(position_ids, base_inv_freq)
                if inv_freq.ndim > 1:
                    inv_freq = inv_freq.unsqueeze(-2)  # (*rows, 1, d/2) against positions (*rows, L, 1)
            freqs = positions[..., None] * inv_freq.to(device)
            emb = torch.cat((freqs, freqs), dim=-1)
            # the model's own attention factor (a YaRN or LongRoPE base) multiplies cos/sin as transformers does
            return (emb.cos() * attention_scaling).to(x.dtype), (emb.sin() * attention_scaling).to(x.dtype)


def clex_rotary_output(module: nn.Module, args: tuple, kwargs: dict, output):
    """Forward hook of a rotary-embedding module carrying ``module.clex``: CLEX's cos/sin replace the output.

    A module-level function (not a closure) so that ``copy.deepcopy`` of the model keeps a working hook.
    """
    x = args[0] if args else kwargs["x"]
    position_ids = args[1] if len(args) > 1 else kwargs["position_ids"]
    return module.clex(x, position_ids, module.inv_freq, getattr(module, "attention_scaling", 1.0))


def attach_clex(rotary: nn.Module, frequencies: CLEXFrequencies) -> None:
    """Make ``rotary`` (a transformers rotary-embedding module) produce CLEX's cos/sin.

    ``frequencies`` becomes its child ``clex`` (so its weights are saved with the model), and a forward hook
    replaces the module's output: transformers' forward runs under ``torch.no_grad``, which would cut the
    gradient to the ODE weights, while a hook runs with the caller's grad mode.
    """
    rotary.clex = frequencies
    rotary.register_forward_hook(clex_rotary_output, with_kwargs=True)
