"""On a CUDA GPU: bf16 by default, nccl, MFU against the table's peak, and an export that still matches HF."""

from __future__ import annotations

import json

import pytest
import torch

from tests.training_jobs.conftest import launch
from training_jobs.flops import peak_flops_for
from training_jobs.settings import TrainingSettings

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_this_gpu_is_in_the_peak_table():
    name = torch.cuda.get_device_name()
    assert peak_flops_for(name) is not None, f"add {name!r} to kiln.planning.hardware.CUDA_NAMES"


def test_one_gpu_run_trains_in_bf16_and_reports_mfu(tmp_path, token_dataset):
    out = tmp_path / "gpu"
    run = TrainingSettings(seq_len=32, micro_batch_size=8, max_steps=20, log_every_steps=5,
                           schedule={"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 3},
                           checkpoint={"every_steps": 10}).to_run_config(
        dataset_dir=token_dataset.dir, tokenizer_sha256=token_dataset.tokenizer_sha256, output_dir=out,
        tokenizer_dir=token_dataset.tokenizer_dir).write(tmp_path / "run.json")
    done = launch(run, nproc=1, env={"DS_ACCELERATOR": "cuda"}, cpu=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == "bf16" and summary["device"] == torch.cuda.get_device_name()
    assert summary["mfu"] is not None and 0 < summary["mfu"] < 1
    assert summary["final_loss"] < 6.0
    # the tiny model fits one GPU many times over: ZeRO-0 under bf16 autocast, not ZeRO-3 (training_jobs/layout.py),
    # with the grad norm from torch's clip, and its checkpoint still exports below
    assert summary["parallelism"]["zero_stage"] == summary["layout"]["zero_stage"] == 0
    assert "fp32 weights under bf16 autocast" in summary["layout"]["reason"]
    grad_norms = [row["train/grad_norm"] for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                  if "train/grad_norm" in row]
    assert len(grad_norms) == 20 and all(n is not None and n > 0 for n in grad_norms)
    assert summary["compile"]["enabled"]  # auto: on for CUDA (inductor), and the run still learned
    assert summary["goodput_tokens_per_s"] <= summary["tokens_per_s"]
    assert 0 < summary["peak_memory_gib"] < torch.cuda.get_device_properties(0).total_memory / 2**30

    transformers = pytest.importorskip("transformers")
    from training_jobs.export import load_model
    kiln = load_model(out / "export" / "safetensors")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out / "export" / "hf", dtype=torch.float32).eval()
    tokens = torch.randint(0, 500, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, kiln(tokens), atol=1e-4, rtol=0)


def test_the_chunked_loss_matches_the_plain_one_in_bf16_on_the_gpu():
    """linear_cross_entropy (chunked, or Liger's kernel where installed) against F.cross_entropy on whole fp32 logits,
    at a training shape: bf16 rounds the gradient at other points in each (tolerance as on CPU's bf16 case)."""
    import torch.nn.functional as F

    from training_jobs.model import IGNORE, linear_cross_entropy

    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(4096, 512, device="cuda", generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(32_000, 512, device="cuda", generator=gen) * 0.02).bfloat16().requires_grad_()
    targets = torch.randint(0, 32_000, (4096,), device="cuda", generator=gen)
    targets[::7] = IGNORE
    loss = linear_cross_entropy(hidden, weight, targets)
    loss.backward()
    grads = hidden.grad.float(), weight.grad.float()
    hidden.grad = weight.grad = None
    plain = F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=IGNORE)
    plain.backward()
    torch.testing.assert_close(loss.float(), plain, rtol=1e-3, atol=0)
    torch.testing.assert_close(grads[0], hidden.grad.float(), rtol=2e-2, atol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad.float(), rtol=2e-2, atol=1e-5)


def test_prefetched_batches_arrive_pinned_and_equal_the_plain_loaders(token_dataset):
    from training_jobs.loader import Prefetcher, ShardLoader

    def loader() -> ShardLoader:
        return ShardLoader(token_dataset.dir, "train", 32, 4, 0, 1, token_dataset.tokenizer_sha256)

    plain, ahead = loader(), Prefetcher(loader(), device=torch.device("cuda", 0))
    try:
        for _ in range(20):
            (x, y), (px, py) = plain.next_batch(), ahead.next_batch()
            assert px.is_pinned() and py.is_pinned() and px.is_contiguous()
            assert torch.equal(x, px) and torch.equal(y, py)
    finally:
        ahead.close()


def test_a_background_save_writes_the_device_state_as_it_was_when_save_returned(tmp_path):
    """The copy to pinned host memory is only queued when save returns; the kernels queued after it (training
    going on) must not reach the file."""
    from training_jobs import checkpoint

    weights = torch.arange(50_000_000, dtype=torch.float32, device="cuda")  # 200 MB: the copy takes a while
    writer = checkpoint.BackgroundWriter()
    writer.save({"w": weights}, tmp_path / "state.pt")
    weights.mul_(-1)  # on the same stream, after the queued copy
    writer.wait()
    writer.close()
    saved = torch.load(tmp_path / "state.pt", weights_only=True)["w"]
    assert saved.device.type == "cpu" and torch.equal(saved, torch.arange(50_000_000, dtype=torch.float32))
