#!/usr/bin/python3
"""cohort's PyTorch peer for language models: nanoGPT's GPT (bias=False, or GPT-2's architecture
with --bias and --gelu tanh) and its character-level Tiny Shakespeare recipe in PyTorch 1.13,
under nanoGPT's module and state_dict names, so that bench/gpt_compare.py can set it beside
`cohort train --model gpt:...` and tests/export can load cohort's safetensors into it (strict;
Hugging Face's GPT-2 layout through from_hugging_face).

    /usr/bin/python3 bench/peers/torch_gpt_peer.py COMMAND --text datasets/tinyshakespeare/input.txt
      [--layers 4 --heads 4 --embd 128 --block 64 --batch 12 --dropout 0] [--threads 2] [--bf16]
      [--bias] [--gelu erf|tanh] [--random-tokens VOCAB]

Commands (each measurement one line `RESULT {json}` on stdout):
    tput   training tokens/s: the median of --reps rounds of --steps steps after --warmup, and
           the process's peak RSS
    train  the recipe for --iters iterations (AdamW lr --lr, betas (0.9, 0.99), weight decay 0.1
           on 2-D tensors, clipping at 1.0, --warmup-iters of linear warmup then cosine to
           --min-lr); the validation loss over the whole validation split in non-overlapping
           windows (cohort's measure) every --eval-every iterations, with the training seconds so
           far (steps only); with --estimates N, also the spread of N estimates of the trained
           model's validation loss, each the mean loss of --estimate-batches random batches
           (nanoGPT's estimate_loss; its CPU recipe uses 20)

Data: the text's sorted distinct characters are the vocabulary; the first 90% trains, the rest
validates. With --random-tokens VOCAB, 2,000,000 uniform tokens of VOCAB (torch's generator,
--seed) in place of the text (tput at GPT-2's shapes). A batch is --batch windows at uniformly random offsets (torch's generator, --seed).
Setup: `scripts/setup.sh test` (python3-torch with libopenblas0-openmp: without it torch's f32
matmuls run on the reference BLAS, about 20x slower).
"""
import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    """LayerNorm(C) with a weight and a bias or none (nanoGPT's), eps 1e-5."""

    def __init__(self, c, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c, heads, dropout, bias=False):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(c, 3 * c, bias=bias)
        self.c_proj = nn.Linear(c, c, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, causal):
        b, t, c = x.shape
        hs = c // self.heads
        q, k, v = (z.reshape(b, t, self.heads, hs).transpose(1, 2)
                   for z in self.c_attn(x).split(c, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        scores = scores.masked_fill(~causal[:t, :t], float("-inf"))
        y = self.attn_dropout(scores.softmax(dim=-1)) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class MLP(nn.Module):
    def __init__(self, c, dropout, bias=False, gelu="erf"):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c, bias=bias)
        self.c_proj = nn.Linear(4 * c, c, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.approximate = "tanh" if gelu == "tanh" else "none"

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, c, heads, dropout, bias=False, gelu="erf"):
        super().__init__()
        self.ln_1 = LayerNorm(c, bias)
        self.attn = CausalSelfAttention(c, heads, dropout, bias)
        self.ln_2 = LayerNorm(c, bias)
        self.mlp = MLP(c, dropout, bias, gelu)

    def forward(self, x, causal):
        x = x + self.attn(self.ln_1(x), causal)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """transformer.{wte, wpe, drop, h.N, ln_f} and lm_head, tied to wte (nanoGPT's tree)."""

    def __init__(self, vocab, block, layers, heads, embd, dropout=0.0, bias=False, gelu="erf"):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, embd), wpe=nn.Embedding(block, embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(embd, heads, dropout, bias, gelu) for _ in range(layers)]),
            ln_f=LayerNorm(embd, bias)))
        self.lm_head = nn.Linear(embd, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        self.register_buffer("causal", torch.ones(block, block, dtype=torch.bool).tril(),
                             persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def logits(self, idx):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1])))
        for b in t.h:
            x = b(x, self.causal)
        return self.lm_head(t.ln_f(x))

    def forward(self, idx, targets):
        z = self.logits(idx)
        return F.cross_entropy(z.reshape(-1, z.shape[-1]), targets.reshape(-1))


def from_hugging_face(tensors):
    """Hugging Face's GPT-2 weights (names without "transformer.", Conv1D weights stored (in, out),
    attn.bias / attn.masked_bias buffers, no lm_head) as this GPT's state_dict."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
            continue
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            t = t.t().contiguous()
        out[name if name.startswith("transformer.") else "transformer." + name] = t
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def load_text(path):
    """(train tokens, validation tokens, characters): nanoGPT's 90/10 split."""
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    n = int(0.9 * len(data))
    return data[:n], data[n:], chars


@torch.no_grad()
def validation_loss(model, val, block, windows=256, bf16=False):
    """The mean cross-entropy per token over the whole split in non-overlapping windows of
    block + 1 tokens (targets: floor((n - 1) / block) x block positions), as cohort measures."""
    was = model.training
    model.eval()
    count = (len(val) - 1) // block
    total = 0.0
    for first in range(0, count, windows):
        offs = range(first, min(count, first + windows))
        x = torch.stack([val[o * block:o * block + block] for o in offs])
        y = torch.stack([val[o * block + 1:o * block + block + 1] for o in offs])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            z = model.logits(x)
        total += F.cross_entropy(z.float().reshape(-1, z.shape[-1]), y.reshape(-1),
                                 reduction="sum").item()
    model.train(was)
    return total / (count * block)


def load_data(a):
    """load_text(a.text), or with --random-tokens VOCAB uniform tokens split 90/10 (no
    characters)."""
    if not a.random_tokens:
        return load_text(a.text)
    gen = torch.Generator().manual_seed(a.seed)
    data = torch.randint(a.random_tokens, (2_000_000,), generator=gen)
    return data[:1_800_000], data[1_800_000:], [None] * a.random_tokens


def make(a, vocab):
    torch.manual_seed(a.seed)
    model = GPT(vocab, a.block, a.layers, a.heads, a.embd, a.dropout, a.bias, a.gelu)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99))
    return model, opt


def lr_at(it, a):
    if it < a.warmup_iters:
        return a.lr * (it + 1) / (a.warmup_iters + 1)
    ratio = min(1.0, (it - a.warmup_iters) / max(1, a.iters - a.warmup_iters))
    return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.lr - a.min_lr)


def batch(data, a, gen):
    offs = torch.randint(len(data) - a.block, (a.batch,), generator=gen).tolist()
    return (torch.stack([data[o:o + a.block] for o in offs]),
            torch.stack([data[o + 1:o + a.block + 1] for o in offs]))


def step(model, opt, x, y, a):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


@torch.no_grad()
def estimates(model, val, a):
    """a.estimates estimates of the validation loss, each nanoGPT's: the mean loss of
    a.estimate_batches random batches (torch's generator, seed a.seed + 1000); their spread."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(a.seed + 1000)
    values = []
    for _ in range(a.estimates):
        losses = []
        for _ in range(a.estimate_batches):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                losses.append(model(*batch(val, a, gen)).item())
        values.append(statistics.fmean(losses))
    model.train(was)
    values.sort()

    def at(q):
        return values[round(q * (len(values) - 1))]

    return {"batches": a.estimate_batches, "count": len(values),
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "p05": at(0.05), "p95": at(0.95), "min": values[0], "max": values[-1]}


def emit(d):
    print("RESULT " + json.dumps(d), flush=True)


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cmd_tput(a):
    train, _, chars = load_data(a)
    model, opt = make(a, len(chars))
    gen = torch.Generator().manual_seed(a.seed)
    batches = [batch(train, a, gen) for _ in range(8)]
    for i in range(a.warmup):
        step(model, opt, *batches[i % 8], a)
    rates = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(model, opt, *batches[i % 8], a)
        rates.append(a.steps * a.batch * a.block / (time.perf_counter() - t0))
    emit({"what": "tput", "bf16": a.bf16, "tokens_per_second": statistics.median(rates),
          "rates": rates, "peak_rss_bytes": peak_rss_bytes(), "threads": torch.get_num_threads()})


def cmd_train(a):
    train, val, chars = load_data(a)
    model, opt = make(a, len(chars))
    gen = torch.Generator().manual_seed(a.seed)
    curve, seconds = [], 0.0
    for it in range(a.iters):
        for g in opt.param_groups:
            g["lr"] = lr_at(it, a)
        x, y = batch(train, a, gen)
        t0 = time.perf_counter()
        step(model, opt, x, y, a)
        seconds += time.perf_counter() - t0
        if (it + 1) % a.eval_every == 0 or it + 1 == a.iters:
            curve.append({"step": it + 1, "elapsed_s": seconds,
                          "val_loss": validation_loss(model, val, a.block, bf16=a.bf16)})
            print(json.dumps(curve[-1]), flush=True)
    result = {"what": "train", "bf16": a.bf16, "curve": curve, "val_loss": curve[-1]["val_loss"],
              "train_seconds": seconds, "peak_rss_bytes": peak_rss_bytes()}
    if a.estimates:
        result["estimates"] = estimates(model, val, a)
    emit(result)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["tput", "train"])
    p.add_argument("--text")
    p.add_argument("--random-tokens", type=int, default=0, metavar="VOCAB")
    p.add_argument("--bias", action="store_true", help="GPT-2's biases (nanoGPT's bias=True)")
    p.add_argument("--gelu", choices=["erf", "tanh"], default="erf")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup-iters", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--estimates", type=int, default=0,
                   help="train: this many estimates of the final validation loss (see --help)")
    p.add_argument("--estimate-batches", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if not a.text and not a.random_tokens:
        p.error("one of --text and --random-tokens is required")
    torch.set_num_threads(a.threads)
    {"tput": cmd_tput, "train": cmd_train}[a.cmd](a)


if __name__ == "__main__":
    main()
