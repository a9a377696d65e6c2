#!/usr/bin/env python3
"""Trains the GPT of `train_gpt` with PyTorch's own pipelining and reports its speed: the
PyTorch side of `cargo bench --bench versus_pytorch` (issue 19).

    python3 tools/pytorch_speed.py --ranks 2 --layers 4 --d-model 192 --heads 4 --seq-len 64 \
        --microbatches 16 --microbatch-size 4 --steps 6 [--schedule zbv]

The model is the one `train_gpt` trains: GPT-2's architecture on bytes (vocabulary 256, learned
positions, Hugging Face's `GPT2Block`s, final layer norm, an untied head), cut into `--ranks` stages
(embedding on the first, head on the last, the blocks spread as evenly as they go, the earlier
stages taking one more), trained by `torch.distributed.pipelining`'s `Schedule1F1B` over gloo, one
process per stage (with one stage, the same schedule on one process), or with `--schedule zbv` by its
`ScheduleZBVZeroBubble` (the model cut into twice as many stages, rank r holding stages r and
2P - 1 - r, each backward split into input and weight gradients); each process with one compute
thread (`torch.set_num_threads(1)`), AdamW after every step. Random bytes as data; the loss is the
cross-entropy over every token of the batch.

Prints one JSON line: `{"tokens_per_second": ..., "step_seconds": [...], "peak_rss_bytes": ...}`,
the tokens per second the median of the steps after the first two, and the peak RSS the sum over
the processes of each one's own peak (what the machine had to hold at worst).
"""

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blocks_of(stage, stages, layers):
    """The global indices of `stage`'s blocks: as even as they go, earlier stages one more."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def build_stage(torch, args, stage, stages):
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(
        vocab_size=256,
        n_positions=args.seq_len,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function="gelu_new",
    )
    config._attn_implementation = "eager"
    config.bos_token_id = config.eos_token_id = None
    first, last = stage == 0, stage == stages - 1

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(100 + stage)
            if first:
                self.wte = torch.nn.Embedding(256, args.d_model)
                self.wpe = torch.nn.Embedding(args.seq_len, args.d_model)
            self.h = torch.nn.ModuleList(
                [GPT2Block(config, layer_idx=i) for i in blocks_of(stage, stages, args.layers)]
            )
            if last:
                self.ln_f = torch.nn.LayerNorm(args.d_model, eps=1e-5)
                self.lm_head = torch.nn.Linear(args.d_model, 256, bias=False)

        def forward(self, x):
            if first:
                positions = torch.arange(x.shape[1], device=x.device)
                x = self.wte(x) + self.wpe(positions)
            for block in self.h:
                out = block(x)
                x = out[0] if isinstance(out, tuple) else out
            if last:
                x = self.lm_head(self.ln_f(x))
            return x

    return Stage()


def loss_fn(logits, targets):
    import torch

    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))


def worker(rank, args, port, out):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    device = torch.device("cpu")
    if args.schedule == "zbv":
        # Two stages per rank in a V: rank r holds stages r and 2P - 1 - r.
        stages = 2 * args.ranks
        indices = [rank, stages - 1 - rank]
        modules = [build_stage(torch, args, i, stages) for i in indices]
        pipeline_stages = [PipelineStage(m, i, stages, device) for m, i in zip(modules, indices)]
        schedule = ScheduleZBVZeroBubble(
            pipeline_stages, n_microbatches=args.microbatches, loss_fn=loss_fn
        )
        # The first and last stages (input and loss) are both on rank 0.
        holds_input = holds_target = rank == 0
    else:
        modules = [build_stage(torch, args, rank, args.ranks)]
        stage = PipelineStage(modules[0], rank, args.ranks, device)
        schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
        holds_input, holds_target = rank == 0, rank == args.ranks - 1
    parameters = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-3)
    generator = torch.Generator().manual_seed(7)
    batch = args.microbatches * args.microbatch_size
    times = []
    for _ in range(args.steps):
        tokens = torch.randint(0, 256, (batch, args.seq_len + 1), generator=generator)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        if holds_input and holds_target:
            schedule.step(inputs, target=targets)
        elif holds_input:
            schedule.step(inputs)
        elif holds_target:
            schedule.step(target=targets)
        else:
            schedule.step()
        optimizer.step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put((rank, times, peak))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=192)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--schedule",
        choices=["1f1b", "zbv"],
        default="1f1b",
        help="Schedule1F1B, or ScheduleZBVZeroBubble (two stages per rank in a V; 2 ranks or more)",
    )
    args = parser.parse_args()
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    processes = [context.Process(target=worker, args=(r, args, port, out)) for r in range(args.ranks)]
    for p in processes:
        p.start()
    results = [out.get(timeout=3600) for _ in processes]
    for p in processes:
        p.join()
    times = max(results, key=lambda r: sum(r[1]))[1]
    measured = times[2:] if len(times) > 2 else times
    step = statistics.median(measured)
    tokens = args.microbatches * args.microbatch_size * args.seq_len
    print(
        json.dumps(
            {
                "tokens_per_second": tokens / step,
                "step_seconds": times,
                "peak_rss_bytes": sum(r[2] for r in results),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
