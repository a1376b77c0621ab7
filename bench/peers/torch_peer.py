#!/usr/bin/python3
"""cohort's PyTorch peer: the same networks, data and optimizer as cohort's presets, trained by
PyTorch on Fashion-MNIST, so that bench/*.py can set the two side by side.

Run it with the system interpreter (Debian's python3-torch 1.13):
    /usr/bin/python3 bench/peers/torch_peer.py COMMAND [flags]
Setup: `scripts/setup.sh test` installs python3-torch and libopenblas0-openmp. Without the
OpenMP OpenBLAS, Debian's torch links the reference BLAS and its f32 linear layers run about 20x
slower: no fair peer.

Commands (each measurement is one line `RESULT {json}` on stdout; bench/*.py read the last one):
    info       torch's version, build configuration, threading, oneDNN and CPU capability
    tput       training samples/s in one process: --model, --threads, --batch, --steps per round,
               --reps rounds after --warmup steps; [--bf16] [--tag SUFFIX]
    ddp        DistributedDataParallel over gloo, 2 processes x 1 thread, --batch global (half
               per process), timed as tput; [--pin 1] pins rank r to CPU r; [--epochs E] also
               trains a fresh model E epochs and reports rank 0's test accuracy; [--port P]
    acc        trains --epochs (default 5) epochs and reports the test accuracy after each:
               [--bf16] [--augment] [--lr X] [--wd X] [--cosine]; one `{'epoch': ...}` line per
               epoch as it ends, then the RESULT line with the whole history
    overhead   per-phase step time (zero_grad, forward + loss, backward, optimizer step) for
               each of --batches
    allreduce  gloo all_reduce latency between 2 processes for the MLP's and the CNN's gradient
               sizes and a 4096-value tensor

Data: the four IDX .gz files of Fashion-MNIST from $FASHION_MNIST_DIR, else
/usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist). Pixels are divided by 255
(float32 in [0, 1], no mean/std normalization), as cohort reads them. Everything is loaded into
tensors before the clock starts; an epoch's order is one permuted copy, so a batch is a view and
the timed region holds training steps only.

Models, module for module the names cohort's `export` writes (so its safetensors load here):
    mlp       fc1 Linear(784, 512) - ReLU - fc2 Linear(512, 256) - ReLU - fc3 Linear(256, 10);
              535,818 parameters
    cnn       c1 Conv2d(1, 32, 5) - ReLU - MaxPool 2 -> 32x12x12;
              c2 Conv2d(32, 64, 5) - ReLU - MaxPool 2 -> 64x4x4 = 1024;
              fc1 Linear(1024, 256) - ReLU - fc2 Linear(256, 10); valid convolutions;
              317,066 parameters
    resnet20  ResNet-20 in its CIFAR form for 1x28x28 inputs, projection shortcuts:
              stem (stem.0 Conv3x3(1, 16, pad 1), stem.1 BatchNorm, ReLU); blocks.0-8, three
              stages of three basic blocks at 16, 32 and 64 channels (c1 Conv3x3 - b1 BN - ReLU -
              c2 Conv3x3 - b2 BN, plus the shortcut, then ReLU); blocks 3 and 6 stride 2 with a
              shortcut short.0 Conv1x1 stride 2 - short.1 BN; global average pool; fc
              Linear(64, 10). Convolutions have no bias; BN eps 1e-5, momentum 0.1.
              272,186 parameters
Parameters are registered in that order (resnet20_logits_check.py relies on it) and initialized
by PyTorch's defaults after torch.manual_seed(0).

Training: softmax cross-entropy; SGD, momentum 0.9, lr 0.05 and no weight decay unless --lr /
--wd say otherwise; --cosine anneals the lr to 0 over the run (acc). --bf16 runs the forward
pass and the loss under torch.autocast("cpu", dtype=torch.bfloat16): oneDNN's bf16 matmuls and
convolutions, f32 master weights, no loss scaling. --augment (acc): per sample, a random 28x28
window of the image zero-padded by 4 on each side, then a horizontal mirror with probability 1/2.
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
SIDE = 28
PIXELS = SIDE * SIDE
CLASSES = 10
EVAL_ROWS = 1000        # test rows per forward pass when measuring accuracy
INIT_SEED = 0           # torch.manual_seed before a model is built
EPOCH_SEED = 100        # epoch e's order is drawn from EPOCH_SEED + e (tput and ddp use seed 0)
AUGMENT_SEED = 7
WORLD = 2               # processes of ddp and allreduce


# --- data -----------------------------------------------------------------------------------------

def read_idx(path):
    """An IDX file (gzip) as a uint8 array: 2 zero bytes, the type code, the rank, then one
    big-endian 32-bit size per dimension and the values."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    shape = struct.unpack_from(f">{rank}I", raw, 4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * rank).reshape(shape)


def load_data(data_dir=None):
    """(train images, train labels, test images, test labels): images (N, 28, 28) float32 in
    [0, 1], labels int64."""
    d = data_dir or DATA_DIR

    def images(name):
        return torch.from_numpy(read_idx(os.path.join(d, name)).astype(np.float32) / 255.0)

    def labels(name):
        return torch.from_numpy(read_idx(os.path.join(d, name)).astype(np.int64))

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def as_input(x, model):
    """Rows as the model takes them: flat vectors for the MLP, 1-channel images otherwise."""
    return x.reshape(-1, PIXELS) if model == "mlp" else x.reshape(-1, 1, SIDE, SIDE)


def permuted(x, y, seed, model):
    """A contiguous copy of (x, y) in the order drawn from seed, x shaped for model."""
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    return as_input(x[order], model).contiguous(), y[order].contiguous()


def crop_and_mirror(x, gen):
    """Per row: the 28x28 window at a random offset (0..8 each way) of the image zero-padded by
    4, mirrored left-right with probability 1/2. Returns (B, 1, 28, 28)."""
    b = x.shape[0]
    pad = 4
    padded = F.pad(x.reshape(b, SIDE, SIDE), (pad, pad, pad, pad))
    top = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    left = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    mirror = torch.rand(b, generator=gen) < 0.5
    span = torch.arange(SIDE)
    rows = (top[:, None] + span)[:, :, None].expand(b, SIDE, SIDE + 2 * pad)
    band = padded.gather(1, rows)                                   # (B, 28, 36)
    cols = (left[:, None] + span)[:, None, :].expand(b, SIDE, SIDE)
    window = band.gather(2, cols)                                   # (B, 28, 28)
    window = torch.where(mirror[:, None, None], window.flip(-1), window)
    return window.unsqueeze(1)


# --- models ---------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, CLASSES)

    def forward(self, x):
        h = F.relu(self.fc1(x.reshape(-1, PIXELS)))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 5)
        self.c2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * 4 * 4, 256)
        self.fc2 = nn.Linear(256, CLASSES)

    def forward(self, x):
        h = x.reshape(-1, 1, SIDE, SIDE)
        for conv in (self.c1, self.c2):
            h = F.max_pool2d(F.relu(conv(h)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(h, 1))))


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """c1-b1-ReLU-c2-b2 plus the input (or its projection `short` where the shape changes),
    then ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = conv3x3(cin, cout, stride)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = conv3x3(cout, cout)
        self.b2 = nn.BatchNorm2d(cout)
        projects = stride != 1 or cin != cout
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                    nn.BatchNorm2d(cout)) if projects else None)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = self.b2(self.c2(h))
        return F.relu(h + (self.short(x) if self.short is not None else x))


class ResNet20(nn.Module):
    STAGES = ((16, 1), (32, 2), (64, 2))  # (channels, stride of the stage's first block)
    BLOCKS_PER_STAGE = 3

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(conv3x3(1, 16), nn.BatchNorm2d(16), nn.ReLU())
        layers, cin = [], 16
        for cout, stride in self.STAGES:
            for i in range(self.BLOCKS_PER_STAGE):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        h = self.blocks(self.stem(x.reshape(-1, 1, SIDE, SIDE)))
        return self.fc(h.mean(dim=(2, 3)))


MODELS = {"mlp": MLP, "cnn": CNN, "resnet20": ResNet20}


def parameter_count(model):
    return sum(p.numel() for p in MODELS[model]().parameters())


# --- training -------------------------------------------------------------------------------------

class Trainer:
    """A model of MODELS, its SGD optimizer and the precision of its forward pass."""

    def __init__(self, model, bf16=False, lr=0.05, wd=0.0):
        torch.manual_seed(INIT_SEED)
        self.kind = model
        self.net = MODELS[model]()
        self.opt = torch.optim.SGD(self.net.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
        self.bf16 = bf16

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16)

    def step(self, x, y):
        """One SGD step on the batch (x, y); returns the loss tensor."""
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = F.cross_entropy(self.net(x), y)
        loss.backward()
        self.opt.step()
        return loss

    def steps(self, X, Y, batch, first, count):
        """count steps over consecutive batches of (X, Y) from batch index first, wrapping
        around at the end of the data (the last partial batch is never used)."""
        per_pass = X.shape[0] // batch
        for k in range(first, first + count):
            at = (k % per_pass) * batch
            self.step(X[at:at + batch], Y[at:at + batch])

    @torch.no_grad()
    def accuracy(self, x, y):
        """Test accuracy in eval mode (bn running statistics), in the training precision."""
        net = getattr(self.net, "module", self.net)  # under DistributedDataParallel: the model
        net.eval()
        right = 0
        for at in range(0, x.shape[0], EVAL_ROWS):
            with self.autocast():
                logits = net(as_input(x[at:at + EVAL_ROWS], self.kind))
            right += int((logits.argmax(1) == y[at:at + EVAL_ROWS]).sum())
        net.train()
        return right / x.shape[0]


def timed_rounds(trainer, X, Y, batch, a, samples_per_step, barrier=lambda: None):
    """Samples/s of each of a.reps rounds of a.steps steps, after a.warmup untimed steps."""
    trainer.steps(X, Y, batch, 0, a.warmup)
    rates = []
    for r in range(a.reps):
        barrier()
        start = time.perf_counter()
        trainer.steps(X, Y, batch, a.warmup + r * a.steps, a.steps)
        barrier()
        rates.append(a.steps * samples_per_step / (time.perf_counter() - start))
    return rates


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


# --- two processes --------------------------------------------------------------------------------

def join_group(rank, port):
    """Joins the gloo process group of WORLD processes on 127.0.0.1:port, one thread each."""
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    return dist


def spawn_pair(worker, a):
    """Runs worker(rank, a, queue) in WORLD spawned processes; returns what rank 0 put."""
    import torch.multiprocessing as mp
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(worker, args=(a, queue), nprocs=WORLD, join=True, start_method="spawn")
    return queue.get()


def ddp_rank(rank, a, queue):
    if a.pin:
        os.sched_setaffinity(0, {rank})
    dist = join_group(rank, a.port)
    from torch.nn.parallel import DistributedDataParallel

    xtr, ytr, xte, yte = load_data()
    local = a.batch // WORLD

    def shard(seed):  # this rank's strided half of an epoch's order
        X, Y = permuted(xtr, ytr, seed, a.model)
        return X[rank::WORLD].contiguous(), Y[rank::WORLD].contiguous()

    def replicated():
        t = Trainer(a.model, a.bf16)
        t.net = DistributedDataParallel(t.net)
        return t

    X, Y = shard(0)
    rates = timed_rounds(replicated(), X, Y, local, a, a.batch, barrier=dist.barrier)
    accuracy = None
    if a.epochs:
        t = replicated()
        for e in range(a.epochs):
            Xe, Ye = shard(EPOCH_SEED + e)
            t.steps(Xe, Ye, local, 0, Xe.shape[0] // local)
        if rank == 0:
            accuracy = t.accuracy(xte, yte)
    if rank == 0:
        queue.put(dict(bench="ddp", model=a.model, procs=WORLD, threads_per_proc=1,
                       global_batch=a.batch, pin=a.pin, bf16=a.bf16, steps=a.steps,
                       samples_per_s=rates, median=statistics.median(rates),
                       test_acc_after_epochs=accuracy, epochs=a.epochs))
    dist.destroy_process_group()


def allreduce_rank(rank, a, queue):
    dist = join_group(rank, a.port)
    latency_us = {}
    for numel in (parameter_count("mlp"), parameter_count("cnn"), 4096):
        t = torch.ones(numel)
        for _ in range(10):
            dist.all_reduce(t)
        seconds = []
        for _ in range(a.steps):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            seconds.append(time.perf_counter() - start)
        latency_us[numel] = 1e6 * statistics.median(seconds)
    if rank == 0:
        queue.put(dict(bench="allreduce", backend="gloo", procs=WORLD,
                       us_median_by_numel=latency_us,
                       GBps_algbw_by_numel={n: 4 * n / us / 1e3 for n, us in latency_us.items()}))
    dist.destroy_process_group()


# --- commands -------------------------------------------------------------------------------------

def cmd_info(a):
    print(torch.__version__)
    print(torch.__config__.show())
    print(torch.__config__.parallel_info())
    print("mkldnn available:", torch.backends.mkldnn.is_available())
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    print("cpu capability:", capability() if capability else "?")


def cmd_tput(a):
    torch.set_num_threads(a.threads)
    xtr, ytr, _, _ = load_data()
    X, Y = permuted(xtr, ytr, 0, a.model)
    rates = timed_rounds(Trainer(a.model, a.bf16), X, Y, a.batch, a, a.batch)
    emit(bench="tput" + a.tag, model=a.model, threads=a.threads, batch=a.batch, steps=a.steps,
         bf16=a.bf16, samples_per_s=rates, median=statistics.median(rates))


def cmd_ddp(a):
    emit(**spawn_pair(ddp_rank, a))


def cmd_allreduce(a):
    emit(**spawn_pair(allreduce_rank, a))


def cmd_acc(a):
    torch.set_num_threads(a.threads)
    xtr, ytr, xte, yte = load_data()
    t = Trainer(a.model, a.bf16, a.lr, a.wd)
    per_epoch = xtr.shape[0] // a.batch
    schedule = (torch.optim.lr_scheduler.CosineAnnealingLR(t.opt, a.epochs * per_epoch)
                if a.cosine else None)
    gen = torch.Generator().manual_seed(AUGMENT_SEED)
    history = []
    for e in range(a.epochs):
        X, Y = permuted(xtr, ytr, EPOCH_SEED + e, a.model)
        loss_sum = 0.0
        start = time.perf_counter()
        for k in range(per_epoch):
            x, y = X[k * a.batch:(k + 1) * a.batch], Y[k * a.batch:(k + 1) * a.batch]
            if a.augment:
                x = as_input(crop_and_mirror(x, gen), a.model)
            loss_sum += float(t.step(x, y))
            if schedule:
                schedule.step()
        seconds = time.perf_counter() - start
        history.append({"epoch": e + 1, "train_loss": loss_sum / per_epoch,
                        "samples_per_s": per_epoch * a.batch / seconds,
                        "test_acc": t.accuracy(xte, yte)})
        print(history[-1], flush=True)
    emit(bench="acc" + a.tag, model=a.model, threads=a.threads, batch=a.batch, epochs=a.epochs,
         bf16=a.bf16, augment=a.augment, lr=a.lr, wd=a.wd, cosine=a.cosine, history=history,
         final_test_acc=history[-1]["test_acc"],
         epoch_samples_per_s_median=statistics.median(h["samples_per_s"] for h in history))


def cmd_overhead(a):
    torch.set_num_threads(a.threads)
    xtr, ytr, _, _ = load_data()
    X, Y = permuted(xtr, ytr, 0, a.model)
    for batch in a.batches:
        t = Trainer(a.model, a.bf16)
        t.steps(X, Y, batch, 0, a.warmup)
        per_pass = X.shape[0] // batch
        phases = {"zero_grad": [], "fwd_loss": [], "backward": [], "opt_step": []}
        for k in range(a.steps):
            at = (k % per_pass) * batch
            x, y = X[at:at + batch], Y[at:at + batch]
            t0 = time.perf_counter()
            t.opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            with t.autocast():
                loss = F.cross_entropy(t.net(x), y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            t.opt.step()
            t4 = time.perf_counter()
            for name, d in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[name].append(d)
        totals = [sum(p) for p in zip(*phases.values())]
        emit(bench="overhead", model=a.model, threads=a.threads, batch=batch, bf16=a.bf16,
             **{f"us_{name}": 1e6 * statistics.median(v) for name, v in phases.items()},
             us_step_total=1e6 * statistics.median(totals))


COMMANDS = {"info": cmd_info, "tput": cmd_tput, "ddp": cmd_ddp, "acc": cmd_acc,
            "overhead": cmd_overhead, "allreduce": cmd_allreduce}


def parse(argv):
    p = argparse.ArgumentParser(description="cohort's PyTorch peer (see the module docstring)")
    p.add_argument("cmd", choices=list(COMMANDS))
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (tput, acc, overhead)")
    p.add_argument("--batch", type=int, default=256, help="global batch")
    p.add_argument("--steps", type=int, default=100,
                   help="timed steps per round (allreduce: calls)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before the first round")
    p.add_argument("--reps", type=int, default=3, help="timed rounds")
    p.add_argument("--epochs", type=int, default=0,
                   help="acc: epochs (0: 5); ddp: train and test too")
    p.add_argument("--pin", type=int, default=0, help="ddp: 1 pins rank r to CPU r")
    p.add_argument("--port", type=int, default=29511, help="ddp, allreduce: rendezvous port")
    p.add_argument("--tag", default="", help="suffix of the bench name in the RESULT line")
    p.add_argument("--batches", type=int, nargs="*", default=[1, 32, 256],
                   help="overhead: batch sizes")
    p.add_argument("--bf16", action="store_true", help="forward and loss under bf16 autocast")
    p.add_argument("--augment", action="store_true", help="acc: random crop (pad 4) and mirror")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--cosine", action="store_true",
                   help="acc: cosine lr schedule to 0 over the run")
    a = p.parse_args(argv)
    if a.cmd == "acc" and not a.epochs:
        a.epochs = 5
    return a


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    COMMANDS[a.cmd](a)


if __name__ == "__main__":
    main()
