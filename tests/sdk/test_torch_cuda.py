"""The SDK's CUDA path on a real GPU: NCCL comm-hook timing with CUDA events, torch's peak memory,
and NVML's per-process memory for the same process. Skipped where there is no CUDA device."""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.torch]
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def test_ddp_on_cuda_is_timed_with_events_and_memory_comes_from_torch_and_nvml():
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from sentinel.sdk import Telemetry
    from sentinel.sdk.torch import instrument

    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        model = DistributedDataParallel(nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)]).cuda(),
                                        device_ids=[0])
        tel = Telemetry(job_id=1, rank=0, start_thread=False)
        instrument(model, tel)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(20):
            with tel.step(tokens=256):
                model(torch.randn(256, 4096, device="cuda")).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        torch.cuda.synchronize()
        batch = tel.take_batch()
        assert batch is not None
        count, seconds, nbytes = batch["collectives"]["all_reduce"]
        params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert count >= 20 and nbytes >= 20 * params_bytes * 0.99
        step_total = sum(s[2] for s in batch["steps"])
        assert 0 < seconds < step_total
        assert batch["memory_source"] == "cuda"
        assert batch["memory_peak_bytes"] == torch.cuda.max_memory_allocated()
        print(f"cuda: {count} all-reduces, {seconds * 1e3:.2f} ms of {step_total * 1e3:.1f} ms steps, "
              f"peak {batch['memory_peak_bytes'] / 2**20:.0f} MiB")

        from collectors.nvml import NvmlCollector

        nvml = NvmlCollector()
        try:
            processes = {p.pid: p.used_bytes for s in nvml.collect([]).accelerators for p in s.processes}
        finally:
            nvml.close()
        print(f"nvml processes: {processes}; this pid {os.getpid()}")
        assert processes.get(os.getpid(), 0) >= torch.cuda.max_memory_allocated()
    finally:
        dist.destroy_process_group()


def test_a_guarded_save_copies_after_the_loops_step_on_a_stream_of_its_own(tmp_path):
    """A loop on a stream of its own: the guarded tensors' device-to-host copies wait for the step save()
    followed (an event on that stream), run on the manager's copy stream while the next forward and backward
    are queued, and the step after waits for them: the checkpoint holds exactly the state at save()."""
    from torch import nn

    from sentinel.sdk.checkpoint import CheckpointManager

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loop = torch.cuda.Stream()
    m = CheckpointManager(job_id=1, rank=0, node="gpu", local_dir=str(tmp_path / "{node}"), catalog=False)

    def step() -> None:
        with torch.cuda.stream(loop):
            model(torch.randn(512, 2048, device="cuda")).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()

    def state() -> dict:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    for n in range(3):
        step()
        with torch.cuda.stream(loop):  # save() where the loop queues its work, as a loop on its stream does
            future = m.save(n, state())
        step()  # its optimizer step waits for the copies
        assert future is not None and future.result(timeout=60).outcome == "written"
    step()
    with torch.cuda.stream(loop):
        future = m.save(10, state())
        want = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}  # on the loop's stream
    step()
    step()
    assert future is not None and future.result(timeout=60).outcome == "written"
    assert m._copies.streams, "the copies went on the manager's own stream"
    got = m.restore(10)
    assert got is not None
    for name, value in want.items():
        assert torch.equal(got.state["model"][name].cpu(), value), name
    m.close()
