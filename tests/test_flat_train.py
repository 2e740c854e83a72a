"""The flat model and local SGD: the flat step must be exactly torch.optim.SGD's rule."""

import numpy as np
import pytest
import torch
from torch import nn

from fedmpi.config import ClientConfig
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule, batch_order, schedule


def small_module(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_flat_vector_holds_parameters_then_float_buffers():
    module = small_module()
    expected = torch.cat([p.detach().reshape(-1) for p in module.parameters()] +
                         [b.reshape(-1) for b in module.buffers() if b.is_floating_point()])
    flat = FlatModel(module)
    assert flat.n_params == sum(p.numel() for p in module.parameters())
    assert flat.dim == flat.n_params + 2 * 8          # BatchNorm running mean and var; not the int counter
    assert torch.equal(flat.vec, expected)
    flat.load(torch.arange(flat.dim, dtype=torch.float32))
    assert module[0].weight.view(-1)[0] == 0 and module[1].running_var[-1] == flat.dim - 1


def test_backward_accumulates_into_the_flat_gradient():
    flat = FlatModel(small_module())
    x = torch.randn(6, 4)
    flat.module(x).sum().backward()
    assert flat.check_grads_bound()
    assert torch.equal(flat.grad[: 32], flat.module[0].weight.grad.reshape(-1))
    assert flat.grad.abs().sum() > 0


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.5, 1e-3)])
def test_flat_sgd_equals_torch_optim_sgd(momentum, wd):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    cfg = ClientConfig(lr=0.1, batch_size=8, epochs=2, momentum=momentum, weight_decay=wd)
    flat = FlatModel(small_module())
    reference = small_module()
    trainer = LocalTrainer(flat, cfg, x, y)
    sched = schedule(cfg, 40)
    loss_sum, seen = trainer.train(torch.arange(40), np.random.default_rng(3), sched)

    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=momentum, weight_decay=wd)
    reference.train()
    for positions in batch_order(np.random.default_rng(3), 40, sched):
        idx = torch.from_numpy(positions)
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x[idx]), y[idx]).backward()
        opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()] +
                         [b.reshape(-1) for b in reference.buffers() if b.is_floating_point()])
    assert seen == 80
    torch.testing.assert_close(flat.vec, expected, rtol=1e-5, atol=1e-6)


def test_schedule_from_epochs_or_steps_and_batch_order_cover_each_epoch():
    assert schedule(ClientConfig(batch_size=10, epochs=2), 25) == Schedule(10, 6)
    assert schedule(ClientConfig(batch_size=10, steps=4), 25) == Schedule(10, 4)
    batches = batch_order(np.random.default_rng(0), 25, Schedule(10, 6))
    assert [len(b) for b in batches] == [10, 10, 5, 10, 10, 5]
    assert sorted(np.concatenate(batches[:3])) == list(range(25))
    steps = batch_order(np.random.default_rng(0), 25, Schedule(10, 4))
    assert [len(b) for b in steps] == [10, 10, 5, 10]


class WithUnused(nn.Module):
    """A model with a parameter the forward pass never uses: it gets no gradient at all."""

    def __init__(self):
        super().__init__()
        self.body = small_module()
        self.unused = nn.Parameter(torch.linspace(-1.0, 1.0, 5))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.5, 1e-3)])
@pytest.mark.parametrize("make", [small_module, WithUnused], ids=["all_used", "one_unused"])
def test_step_inside_backward_equals_the_flat_step_bit_for_bit(momentum, wd, make):
    """Without a grad_hook each parameter steps inside the backward pass; with one (here a no-op) the step
    runs on the flat gradient. Both must leave the same bits, also for a parameter that got no gradient
    (weight decay still moves it, as torch.optim.SGD with a zero gradient does)."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    cfg = ClientConfig(lr=0.1, batch_size=8, epochs=2, momentum=momentum, weight_decay=wd)
    results = []
    for grad_hook in (None, lambda params, grad: None):
        torch.manual_seed(0)
        flat = FlatModel(make())
        loss_sum, seen = LocalTrainer(flat, cfg, x, y).train(torch.arange(40), np.random.default_rng(3),
                                                             schedule(cfg, 40), grad_hook=grad_hook)
        results.append((flat.vec.clone(), float(loss_sum), seen))
        assert flat.check_grads_bound()          # the views are bound again after the steps in backward
        if make is WithUnused:  # weight decay moves it (momentum alone only carries a zero buffer)
            unchanged = torch.equal(flat.module.unused.detach(), torch.linspace(-1.0, 1.0, 5))
            assert unchanged == (wd == 0)
    (fused, loss_a, seen_a), (flat_path, loss_b, seen_b) = results
    assert torch.equal(fused, flat_path) and loss_a == loss_b and seen_a == seen_b == 80


def test_the_flat_gradient_is_made_on_first_use_with_what_autograd_made():
    """No model-sized gradient until something needs the whole of it (a grad_hook's flat step): training
    that steps inside the backward pass never makes it. Made after a plain backward, it holds that gradient
    (as accumulating into zeros would have), and the parameters' .grad are its views from then on."""
    flat = FlatModel(small_module())
    x, y = torch.randn(6, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0, 1, 2])
    cfg = ClientConfig(lr=0.1, batch_size=3, epochs=1)
    LocalTrainer(flat, cfg, x, y).train(torch.arange(6), np.random.default_rng(0), schedule(cfg, 6))
    assert flat._grad is None and all(p.grad is None for p in flat.trainable)
    nn.functional.cross_entropy(flat.module(x), y).backward()
    made = [p.grad.clone() for p in flat.trainable]
    assert torch.equal(flat.grad, torch.cat([g.reshape(-1) for g in made])) and flat.check_grads_bound()
    flat.zero_grad()
    nn.functional.cross_entropy(flat.module(x), y).backward()
    assert torch.equal(flat.grad, torch.cat([g.reshape(-1) for g in made]))     # accumulated into the views


@pytest.mark.parametrize("n", [1, 7, 65_536, 65_537, 200_003])
def test_add_update_is_the_float64_multiply_add_of_the_float32_difference(n):
    from fedmpi.core.flat import add_update

    g = torch.Generator().manual_seed(n)
    for weight in (1.0, 80.0, 0.37, 1 / 3):
        vec = torch.randn(n, generator=g) * 10.0 ** torch.randint(-5, 5, (n,), generator=g)
        start = torch.randn(n, generator=g)
        acc = torch.randn(n, generator=g, dtype=torch.float64)
        want = acc.clone().add_(vec - start, alpha=weight)
        assert torch.equal(add_update(acc, vec, start, weight, block=4096 if n > 4096 else max(1, n // 2)), want)


@pytest.mark.parametrize("n", [1, 7, 65_536, 200_003])
def test_sq_distance_sums_the_float32_difference_squared_in_float64(n):
    from fedmpi.core.flat import sq_distance

    g = torch.Generator().manual_seed(n)
    vec = torch.randn(n, generator=g) * 10.0 ** torch.randint(-3, 3, (n,), generator=g)
    start = torch.randn(n, generator=g)
    diff = (vec - start).double()               # the update's own float32 rounding, then exact squares
    want = float(diff.dot(diff))
    for block in (max(1, n // 3), 4096, n + 1):     # blocked, and the one-pass form
        assert sq_distance(vec, start, block=block) == pytest.approx(want, rel=1e-12)
    assert sq_distance(torch.tensor([3.0, 1.0]), torch.tensor([0.0, 5.0])) == 25.0     # 3^2 + 4^2
