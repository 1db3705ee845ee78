"""Issue 17: FSDP2 (`fully_shard`) under ember, on two gloo processes on the CPU.

The usual recipe: each block sharded, then compiled (`ember.compile(block)`). FSDP's hooks
(all-gather the block's parameters before its forward, free them after, reduce-scatter the
gradients) run in Python around the compiled forward; the training matches eager FSDP."""

from __future__ import annotations

import torch
from torch import nn

import ember
from ember.testing import CountingBackend


class Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _sharded(mesh, backend) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh)
        if backend is not None:
            model.blocks[i] = ember.compile(block, backend=backend)
    fully_shard(model, mesh=mesh)
    return model


def fsdp_program(rank: int, backend: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    counter = CountingBackend(backend)
    results = {}
    for name, compiler in (("eager", None), ("ember", counter)):
        model = _sharded(mesh, compiler)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            loss = model(torch.randn(8, 32, generator=gen)).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        results[name] = [p.full_tensor().detach().clone() for p in model.parameters()]
    results["graphs"] = counter.frame_count
    results["stats"] = ember.stats()
    return results


def test_fsdp_blocks_compiled_train_as_eager_fsdp(pair):
    results = pair.run(fsdp_program, "aot_eager")
    for result in results:
        for ours, eager in zip(result["ember"], result["eager"], strict=True):
            torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-6)
        stats = result["stats"]
        assert stats["graph_breaks"] == 0 and stats["eager_frames"] == 0, stats
        assert result["graphs"] == 3  # one per block: each is its own module
    for a, b in zip(results[0]["ember"], results[1]["ember"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fsdp_with_ember_backend(pair):
    results = pair.run(fsdp_program, "ember")
    for result in results:
        for ours, eager in zip(result["ember"], result["eager"], strict=True):
            torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-6)
