"""The benchmark's reference loop (`bench.py`'s `reference`): the plain single-process PyTorch loop, the floor
on the machine at hand. One process, torch threads 1, nn.Module and torch.optim.SGD, no flat vector, no MPI, no
run file, doing exactly the same work as fedmpi: the same model and initial weights, data, partition, selected
clients, batches (the same (seed, round, client) streams), dropout draws (each client's seeded generator),
SGD steps, FedAvg average (float64 sums of w_i (w_i - x), w_i = n_i or 1 under server.weighting uniform)
and (W3) FSL server step."""

from __future__ import annotations

import math
import time


def reference(cfg_map, device="cpu", pace=None, share=None):
    """The plain single-process loop (on `device`: bench/gpu_check.py runs it on the GPU); returns per-round
    seconds and the final accuracy. `pace` (bench/pacing.Baton, or None): wait for the turn before each
    round, report it done after (outside the round's clock). `share` (k, K): train only the k-th of K
    shares of each round's clients, dealt as fedmpi deals them to K training ranks
    (fedmpi.mpi.runtime.place_clients): K such processes side by side are the two-process floor ("ref x2"),
    whose server step averages its own share only (the timing, not the model, is the point)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    device = torch.device(device)
    from fedmpi import config
    from fedmpi.core import rng
    from fedmpi.core.models import build_model
    from fedmpi.core.train import seed_torch_on
    from fedmpi.data import load_dataset
    from fedmpi.data.server_set import split_dataset
    from fedmpi.mpi.runtime import place_clients

    cfg = config.from_dict(cfg_map)
    ds = load_dataset(cfg)
    split = split_dataset(ds, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every)
    parts, server_idx = split.parts, split.server_idx
    rng.seed_torch(cfg.seed, rng.INIT)
    model = build_model(cfg.model, ds.input_shape, ds.num_classes).to(device)
    x_tr, y_tr = torch.from_numpy(ds.x_train).to(device), torch.from_numpy(ds.y_train).to(device)
    x_te, y_te = torch.from_numpy(ds.x_test).to(device), torch.from_numpy(ds.y_test).to(device)
    params = list(model.parameters())
    glob = [p.detach().clone() for p in params]
    c, sizes = cfg.client, np.array([len(p) for p in parts])
    steps = lambda n: c.steps or c.epochs * math.ceil(n / c.batch_size)  # noqa: E731

    def batches(g, n, batch, count):
        out = []
        while len(out) < count:
            perm = g.permutation(n)
            out.extend(perm[i:i + batch] for i in range(0, n, batch))
        return out[:count]

    def sgd(indices, g, batch, count, lr, momentum=0.0, wd=0.0):
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
        model.train()
        for pos in batches(g, len(indices), batch, count):
            idx = indices[torch.from_numpy(pos).to(device)]
            opt.zero_grad()
            F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()

    def load(vectors):
        with torch.no_grad():
            for p, v in zip(params, vectors):
                p.copy_(v)

    fsl = cfg.algorithm.name == "fsl"
    if fsl:   # the FSL paper's default server schedule (B0 = B, E_s from the sizes, eta0 = sqrt(S) eta K / K0)
        n0, k = len(server_idx), cfg.algorithm
        b0 = k.server_batch_size or c.batch_size
        e0 = k.server_epochs or math.ceil(float(sizes.sum()) / (len(sizes) * n0) * c.epochs)
        k0 = e0 * math.ceil(n0 / b0)
        k_c = c.steps or c.epochs * math.ceil(float(sizes.mean()) / c.batch_size)
        lr0 = k.gamma * (k.server_lr or math.sqrt(cfg.server.clients_per_round) * c.lr * k_c / k0)
        d0 = torch.from_numpy(server_idx).to(device)

    times, cpu, acc = [], [], float("nan")
    for t in range(cfg.rounds):
        if pace is not None:
            pace.wait()
        t0, c0 = time.monotonic(), time.process_time()
        chosen = rng.select_clients(cfg.seed, t, cfg.partition.clients, cfg.server.clients_per_round)
        if share is not None:
            dealt = place_clients([len(parts[cid]) for cid in chosen], list(range(share[1])))
            chosen = [cid for cid, k in zip(chosen, dealt) if k == share[0]]
        sums = [torch.zeros_like(v, dtype=torch.float64) for v in glob]
        weight = 0.0
        for cid in chosen:
            load(glob)
            seed_torch_on(device, cfg.seed, rng.CLIENT, t, cid, 1)    # the client's dropout draws, as fedmpi's
            sgd(torch.from_numpy(parts[cid]).to(device), rng.stream(cfg.seed, rng.CLIENT, t, cid), c.batch_size,
                steps(len(parts[cid])), c.lr, c.momentum, c.weight_decay)
            w = 1.0 if cfg.server.weighting == "uniform" else float(len(parts[cid]))
            with torch.no_grad():
                for s, p, v in zip(sums, params, glob):
                    s.add_(p - v, alpha=w)
            weight += w
        glob = [v + (s * (cfg.server.lr / weight)).to(v.dtype) for v, s in zip(glob, sums)]
        if fsl and cfg.algorithm.gamma > 0:
            load(glob)
            sgd(d0, rng.stream(cfg.seed, rng.SERVER, t), b0, k0, lr0)
            glob = [p.detach().clone() for p in params]
        if (t + 1) % cfg.eval.every == 0 or t + 1 == cfg.rounds:
            load(glob)
            model.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, len(y_te), cfg.eval.batch_size):
                    j = i + cfg.eval.batch_size
                    correct += int((model(x_te[i:j]).argmax(1) == y_te[i:j]).sum())
            acc = correct / len(y_te)
        times.append(time.monotonic() - t0)
        cpu.append(time.process_time() - c0)
        if pace is not None:
            pace.done()
    return {"rounds": times, "busy_rounds": cpu, "acc": acc,
            "global": torch.cat([v.reshape(-1) for v in glob]).cpu().numpy()}
