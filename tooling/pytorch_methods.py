"""Each method's local objective and state as its reference code has them,
in PyTorch: the methods of `pytorch_loop`'s federation.

A method here is what the reference code adds to FedAvg's loop, written
as that code writes it, with its state in memory as that code keeps it:

- FedProx: NIID-Bench's `train_net_fedprox`, `(mu / 2) ||w - w_g||^2`
  summed over the parameters at every step.
- SCAFFOLD: NIID-Bench's `train_net_scaffold`: after each optimizer step
  `w <- w - lr (c - c_i)`; after the client's K steps
  `c_i <- c_i - c + (w_g - w) / (K lr)`; the server adds
  `sum(c_i_new - c_i) / N` to `c`. Clients' `c_i` are a list in memory.
- MOON: the MOON repo's `train_net_fedcon`: the projections of the global
  and the client's previous model (full forward passes, no gradient) and
  cross-entropy over `[cos(z, z_g), cos(z, z_prev)] / tau` with label 0.
  Previous models are kept in memory (the repo's `old_nets_pool`).
- FedCKA: its paper's Eq. 2 (no code is public) over the first M layers,
  the global and previous models run up to the M-th layer only, linear
  CKA from Gram matrices. Previous models in memory.
- FedMAX: its code's `nn.KLDivLoss()(log_softmax(act), softmax(zeros))`.
- FedCos: its code's `penalty5` on `w - w_g` and the global model's last
  move, which the server keeps.

As the project does, MOON and FedCKA add no term for a client with no
previous model, and FedCos none while there is no last move. Settings and
the averaging rule are the project's (`settings` is the method's
settings as `dataclasses.asdict` gives them), so a twin's round can be
compared with the project's process.

This module is run by an interpreter with torch and without the project
(`pytorch_loop` imports it as a file there): it imports nothing but the standard
library at its top, and torch where it runs.
"""

from typing import Any, Optional, Sequence


class FedAvg:
  """FedAvg: no term, no state. The base of every method below.

  The loop calls, in each round: `start_round` (the global parameters), for
  each client `start_client`, `loss` after every forward pass, `after_step`
  after every optimizer step and `end_client`; then `end_round` with the
  new global parameters. `reads` names the model outputs `loss` reads.
  """

  reads: tuple[str, ...] = ()
  momentum = True  # Whether clients use the client momentum.
  uniform = False  # Whether the models are averaged uniformly.

  def __init__(self, settings: dict, num_clients: int, learning_rate: float):
    self.settings = settings
    self.num_clients = num_clients
    self.learning_rate = learning_rate

  def start_round(self, global_params: Sequence[Any]) -> None:
    self.global_params = [p.detach().clone() for p in global_params]

  def start_client(self, client: int, model: Any, global_model: Any) -> None:
    pass

  def loss(self, data_loss: Any, outputs: dict, x: Any, params) -> Any:
    del outputs, x, params
    return data_loss

  def after_step(self, params: Sequence[Any]) -> None:
    pass

  def end_client(self, client: int, params: Sequence[Any], steps: int) -> None:
    pass

  def end_round(self, new_global: Sequence[Any]) -> None:
    pass


class FedProx(FedAvg):
  def loss(self, data_loss, outputs, x, params):
    import torch

    proximal = sum(
      torch.norm(p - g) ** 2 for p, g in zip(params, self.global_params)
    )
    return data_loss + self.settings['mu'] / 2 * proximal


class FedMAX(FedAvg):
  reads = ('features',)

  def loss(self, data_loss, outputs, x, params):
    import torch

    act = outputs['features']
    kl = torch.nn.KLDivLoss(reduction='mean')(
      torch.log_softmax(act, dim=1), torch.softmax(torch.zeros_like(act), 1)
    )
    return data_loss + self.settings['beta'] * kl


class FedCos(FedAvg):
  """`penalty5`: `mu (1 - <delta, d> / sqrt(|delta|^2 |d|^2 + 1e-4))`."""

  def __init__(self, settings, num_clients, learning_rate):
    super().__init__(settings, num_clients, learning_rate)
    if settings.get('direction', 'global_move') != 'global_move':
      raise ValueError("The FedCos twin follows the global model's move.")
    self.previous_global = None
    self.direction = None

  def start_round(self, global_params):
    import torch

    super().start_round(global_params)
    if self.previous_global is not None:
      self.direction = torch.cat(
        [
          (g - p).reshape(-1)
          for g, p in zip(self.global_params, self.previous_global)
        ]
      )
    self.previous_global = [p.clone() for p in self.global_params]

  def loss(self, data_loss, outputs, x, params):
    import torch

    d = self.direction
    if d is None or float(torch.sum(d * d)) == 0.0:
      return data_loss
    delta = torch.cat(
      [(p - g).reshape(-1) for p, g in zip(params, self.global_params)]
    )
    cosine = torch.sum(delta * d) / torch.sqrt(
      torch.sum(delta * delta) * torch.sum(d * d) + 1e-4
    )
    return data_loss + self.settings['mu'] * (1.0 - cosine)


class Scaffold(FedAvg):
  """Option II with NIID-Bench's correction after the optimizer step."""

  def __init__(self, settings, num_clients, learning_rate):
    super().__init__(settings, num_clients, learning_rate)
    self.momentum = bool(settings.get('momentum', False))
    self.uniform = settings.get('weighting', 'uniform') == 'uniform'
    self.c = None
    self.c_clients = {}  # Each client's c_i, in memory.

  def start_round(self, global_params):
    import torch

    super().start_round(global_params)
    if self.c is None:
      self.c = [torch.zeros_like(p) for p in global_params]
    self.deltas = []

  def start_client(self, client, model, global_model):
    import torch

    self.c_i = self.c_clients.setdefault(
      client, [torch.zeros_like(c) for c in self.c]
    )

  def after_step(self, params):
    import torch

    with torch.no_grad():
      for p, c, c_i in zip(params, self.c, self.c_i):
        p.sub_(self.learning_rate * (c - c_i))

  def end_client(self, client, params, steps):
    new = [
      c_i - c + (g - p.detach()) / (steps * self.learning_rate)
      for c_i, c, g, p in zip(self.c_i, self.c, self.global_params, params)
    ]
    self.deltas.append([n - c_i for n, c_i in zip(new, self.c_i)])
    self.c_clients[client] = new

  def end_round(self, new_global):
    for deltas in self.deltas:
      for c, d in zip(self.c, deltas):
        c.add_(d / self.num_clients)


class _Contrastive(FedAvg):
  """A method that contrasts with the global and the client's previous
  model: the previous models are kept in memory, a copy per client."""

  def __init__(self, settings, num_clients, learning_rate):
    super().__init__(settings, num_clients, learning_rate)
    self.previous = {}

  def start_client(self, client, model, global_model):
    self.global_model = global_model
    self.previous_model = self.previous.get(client)

  def end_client(self, client, params, steps):
    import copy

    model = copy.deepcopy(self.global_model)
    for target, p in zip(model.parameters(), params):
      target.data.copy_(p.detach())
    model.requires_grad_(False)
    self.previous[client] = model


class Moon(_Contrastive):
  reads = ('z',)

  def loss(self, data_loss, outputs, x, params):
    import torch

    if self.previous_model is None:
      return data_loss
    z = outputs['z']
    with torch.no_grad():
      z_global = self.global_model.outputs(x, ('z',))['z']
      z_previous = self.previous_model.outputs(x, ('z',))['z']
    cos = torch.nn.CosineSimilarity(dim=-1)
    logits = torch.stack([cos(z, z_global), cos(z, z_previous)], 1)
    logits = logits / self.settings['temperature']
    labels = torch.zeros(x.size(0), dtype=torch.long)
    contrastive = torch.nn.functional.cross_entropy(logits, labels)
    return data_loss + self.settings['mu'] * contrastive


def _centered_gram(a):
  flat = a.reshape(a.size(0), -1)
  gram = flat @ flat.T
  gram = gram - gram.mean(0, keepdim=True)
  return gram - gram.mean(1, keepdim=True)


def linear_cka(a, b):
  """Kornblith et al.'s linear CKA from the B x B Gram matrices."""
  import torch

  gram_a, gram_b = _centered_gram(a), _centered_gram(b)
  return torch.sum(gram_a * gram_b) / (
    torch.norm(gram_a) * torch.norm(gram_b) + 1e-12
  )


class FedCKA(_Contrastive):
  def __init__(self, settings, num_clients, learning_rate):
    super().__init__(settings, num_clients, learning_rate)
    if settings.get('similarity', 'linear_cka') != 'linear_cka':
      raise ValueError('The FedCKA twin compares layers with linear CKA.')
    self.reads = tuple(f'layer_{n + 1}' for n in range(settings['layers']))

  def loss(self, data_loss, outputs, x, params):
    import torch

    if self.previous_model is None:
      return data_loss
    with torch.no_grad():
      global_outputs = self.global_model.outputs(x, self.reads)
      previous_outputs = self.previous_model.outputs(x, self.reads)
    terms = []
    for name in self.reads:
      logits = torch.stack(
        [
          linear_cka(outputs[name], global_outputs[name]),
          linear_cka(outputs[name], previous_outputs[name]),
        ]
      )
      terms.append(torch.logsumexp(logits, 0) - logits[0])
    return data_loss + self.settings['mu'] * sum(terms) / len(terms)


TWINS = {
  'fedavg': FedAvg,
  'fedprox': FedProx,
  'scaffold': Scaffold,
  'moon': Moon,
  'fedcka': FedCKA,
  'fedmax': FedMAX,
  'fedcos': FedCos,
}


def twin(
  name: str,
  settings: Optional[dict],
  num_clients: int,
  learning_rate: float,
) -> FedAvg:
  """Method `name`'s twin with the method's `settings`."""
  if name not in TWINS:
    raise ValueError(
      f'No PyTorch twin of {name!r}; there are: {", ".join(TWINS)}.'
    )
  return TWINS[name](dict(settings or {}), num_clients, learning_rate)
