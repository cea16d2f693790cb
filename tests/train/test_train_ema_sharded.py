"""The EMA on sharded parameters (torch DTensor, as FSDP2 makes them): two gloo processes each average their own
shard; gathered, the average equals the EMA of the full tensors, and swapping it in changes only the local shards.

Accelerate runs FSDP on GPUs only, so this exercises the EMA's sharded path directly with ``distribute_tensor``.
About 40 s on 2 cores (two interpreters import ropekit), hence ``slow``: run it with ``-m slow``.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from ropekit.train.ema import EMA

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        mesh = init_device_mesh("cpu", (world,))
        gen = torch.Generator().manual_seed(0)
        full = torch.randn(6, 5, generator=gen)  # same on every rank
        param = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
        assert param.to_local().shape == (3, 5)
        ema = EMA([("w", param)], decay=0.75, every=1)
        assert ema.sharded and ema.shadow[0].shape == (3, 5)
        reference = full.double().clone()
        for step in range(1, 4):
            new_full = torch.randn(6, 5, generator=gen)
            with torch.no_grad():
                param.to_local().copy_(new_full[rank * 3:(rank + 1) * 3])
            ema.update(step)
            reference = 0.75 * reference + 0.25 * new_full.double()
        from torch.distributed.tensor import DTensor

        gathered = DTensor.from_local(ema.shadow[0], mesh, [Shard(0)]).full_tensor()
        torch.testing.assert_close(gathered.double(), reference, rtol=1e-6, atol=1e-6)
        trained = param.full_tensor().clone()
        with ema.swap():
            torch.testing.assert_close(param.full_tensor().double(), reference, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(param.full_tensor(), trained, rtol=0, atol=0)
        ema.save(out_dir, rank, rank == 0)
        dist.barrier()
        fresh = EMA([("w", param)], decay=0.75)
        fresh.load(out_dir, rank)
        torch.testing.assert_close(fresh.shadow[0], ema.shadow[0], rtol=0, atol=0)
        assert fresh.updates == 3
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ema_of_shards_is_the_ema_of_the_full_tensor(tmp_path):
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ema-rank0.pt", "ema-rank1.pt"]
