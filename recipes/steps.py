"""One optimizer step (of one batch, or of several accumulated micro-batches), with no host-device
synchronisation inside it.

`StepRunner(x, y, state)` runs forward, backward (the allreduce backend's hooks average the gradients over ranks)
and the optimizer step, under autocast when `run.amp` asks for it. A step whose averaged gradients are not
finite is skipped on the device: GradScaler does it under fp16 (and lowers its scale); otherwise the fused
optimizers get GradScaler's `found_inf` flag. Each step leaves its flag on the device, and `settle` reads the
pending flags in one transfer (every `log.every_steps` steps and before a checkpoint), then counts, logs or
halts exactly as the step itself would have (`run.on_nonfinite`).

Before the optimizer step, the step takes the gradients' total L2 norm (recipes/metrics.py's `grad_norm`: after
the allreduce and the fp16 unscale) and, with `optim.clip_grad_norm` > 0, scales them by min(1, clip / norm) on the
device (torch's clip_grad_norm_ without its host check). A step returns its named device values,
`{"loss": ..., "grad_norm": ...}`, which the trainer's EpochClock sums and reads once per log window.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext

import torch
from torch import nn

from base import registry
from base.errors import TrainingError
from recipes import proofs as proofs_
from recipes.config import Config
from recipes.distributed import DistInfo, abort_process_groups, collective_guard, failed_ranks
from recipes.metrics import GRAD_NORM, LOSS


def create_criterion(cfg: Config) -> nn.Module:
    """Label-smoothed cross-entropy; with AugMix views (data.aug_splits), timm's JSD consistency loss on top."""
    if splits := cfg.data.get("aug_splits", 0):  # a pipeline without timm's AugMix makes no views
        from timm.loss import JsdCrossEntropy

        return JsdCrossEntropy(num_splits=splits, smoothing=cfg.optim.label_smoothing)
    return nn.CrossEntropyLoss(label_smoothing=cfg.optim.label_smoothing)


def amp_context(amp: str, device: torch.device):
    """A factory of the autocast context of `run.amp` ('none', 'bf16', 'fp16'; nullcontext for fp32)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    if dtype is None:
        return nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


class StepRunner:
    """Runs training steps of `train_model` (the backend-wrapped `model`) and settles their finite checks.

    `optim`: the optimizer's record (base/registry.py `OPTIMIZERS[optim.name]`): whether its step skips on the
    device and the skip flag's shape; `amp`: `run.amp`; `on_nonfinite`: `run.on_nonfinite`; `timeout_s`: how long
    the gradient allreduce may take (`dist.timeout_s`); `backend`: the allreduce backend's name, for the timeout's
    message; `clip_grad_norm`: `optim.clip_grad_norm` (0: off).
    """

    def __init__(
        self,
        *,
        model,
        train_model,
        optimizer,
        optim: registry.Optimizer,
        scaler,
        comm,
        criterion: nn.Module,
        device: torch.device,
        amp: str = "none",
        on_nonfinite: str = "halt",
        timeout_s: float = 300.0,
        backend: str = "ddp",
        clip_grad_norm: float = 0.0,
    ):
        self.model, self.train_model = model, train_model
        self.clip_grad_norm = clip_grad_norm
        self.optimizer, self.scaler, self.comm, self.device = optimizer, scaler, comm, device
        self.optim = optim
        self.criterion = criterion
        self.amp_ctx = amp_context(amp, device)
        self.on_nonfinite, self.timeout_s, self.backend = on_nonfinite, timeout_s, backend
        self.pending: list = []  # (step, epoch, non-finite flag, loss, fp16 scale) of steps not yet settled

    def nonfinite_flag(self, norm: torch.Tensor | None = None) -> torch.Tensor:
        """1.0 if any gradient is inf/nan, else 0.0: a float tensor on the device in the shape the optimizer's record
        asks of `found_inf` (GradScaler's form). `norm`: the gradients' total norm (`grad_norm`), when the step has
        it already."""
        if norm is None:
            norm = total_grad_norm(self.model, self.device)
        return (~torch.isfinite(norm)).float().reshape(self.optim.skip_flag_shape)

    def grad_norm(self) -> torch.Tensor:
        """The total L2 norm of the gradients the optimizer is about to apply (0-dim, on the device; inf/NaN when
        one is), then `clip_grad_norm` applied to them in place: never read on the host, no data-dependent branch
        (a CUDA graph captures it)."""
        norm = total_grad_norm(self.model, self.device)
        if self.clip_grad_norm > 0:
            params = [p for p in self.model.parameters() if p.grad is not None]
            # the coefficient min(1, clip / (norm + 1e-6)) is clamped on the device: no host sync
            torch.nn.utils.clip_grads_with_norm_(params, self.clip_grad_norm, norm, foreach=True)
        return norm

    def __call__(self, x: torch.Tensor, y: torch.Tensor, st, log=None, micro_batches: int = 1) -> dict:
        """One optimizer step on (x, y); advances `st.step` and `st.epoch_step`; returns the step's device values by
        metric name: the loss and the gradient norm (recipes/metrics.py).

        `micro_batches` A > 1: gradient accumulation. (x, y) is cut into A equal micro-batches, each run forward
        and backward with its loss scaled by 1/A (so the gradients sum to the mean over the whole batch); the first
        A - 1 passes keep their gradients local (`comm.no_sync`), the last one allreduces the sum, so the
        allreduce, the optimizer step and the non-finite check happen once per step. BN statistics are per
        micro-batch (as in NVIDIA's examples).
        """
        self.optimizer.zero_grad(set_to_none=True)
        what = f"gradient allreduce (comm.backend={self.backend})"
        with collective_guard(what, st.step, self.timeout_s):
            loss = self._backward(x, y, micro_batches)
            if self.scaler.is_enabled():
                scale_before = self.scaler._get_scale_async().clone()
                # Unscale in place, in the one fused kernel that checks for inf/NaN anyway (GradScaler would run
                # it with a scale of 1 and hand the optimizer the scale to divide by, a second pass and copy).
                self.scaler.unscale_(self.optimizer)
                norm = self.grad_norm()  # inf/NaN on an overflow: the scaler skips that step
                self.scaler.step(self.optimizer)
                self.scaler.update()
                # GradScaler lowers the scale exactly when it skipped the step (fp16 overflow)
                bad = self.scaler._get_scale_async() < scale_before
                self.pending.append((st.step, st.epoch, bad, loss, scale_before))
            else:
                # Gradients are already averaged over ranks here, so every rank takes the same decision.
                norm = self.grad_norm()
                found = self.nonfinite_flag(norm)
                if self.optim.skips_on_device:
                    self.optimizer.found_inf = found
                    try:
                        self.optimizer.step()
                    finally:
                        del self.optimizer.found_inf
                elif not bool(found):  # an optimizer without device-side skipping (lamb): decided on the host
                    self.optimizer.step()
                self.pending.append((st.step, st.epoch, found, loss, None))
        st.step += 1
        st.epoch_step += 1
        self.comm.on_step_end(st.step, log)
        return {LOSS.name: loss, GRAD_NORM.name: norm}

    def _backward(self, x: torch.Tensor, y: torch.Tensor, micro_batches: int) -> torch.Tensor:
        """Forward and backward of the step's micro-batches; the batch's mean loss, detached."""
        if micro_batches == 1:
            with self.amp_ctx():
                loss = self.criterion(self.train_model(x), y)
            self.scaler.scale(loss).backward()
            return loss.detach()
        if x.shape[0] % micro_batches:
            raise TrainingError(
                f"a batch of {x.shape[0]} images cannot be cut into {micro_batches} equal micro-batches"
            )
        xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
        total = torch.zeros((), device=x.device)
        for i, (xm, ym) in enumerate(zip(xs, ys, strict=True)):
            last = i + 1 == micro_batches
            # around forward too: DDP decides at forward time whether the backward pass will reduce
            with nullcontext() if last else self.comm.no_sync(self.train_model):
                with self.amp_ctx():
                    loss = self.criterion(self.train_model(xm), ym) / micro_batches
                self.scaler.scale(loss).backward()
            total += loss.detach().float()
        return total

    def settle(self, st, log) -> None:
        """Read the pending steps' non-finite flags (one host sync) and count, log or halt as each step would."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        flags = torch.cat([f.reshape(1).float() for _, _, f, _, _ in pending]).tolist()
        for (step, epoch, _, loss, scale), bad in zip(pending, flags, strict=True):
            if not bad:
                continue
            st.skipped_steps += 1
            if scale is not None:
                log.warn(f"step {step}: fp16 gradients overflowed; step skipped (scale {float(scale):g})")
                continue
            what = f"non-finite loss/gradients at step {step} (epoch {epoch + 1}, loss {float(loss):g})"
            if self.on_nonfinite == "halt":
                raise TrainingError(f"{what}: halting (run.on_nonfinite=halt; 'skip' skips such steps)")
            log.warn(f"{what}: step skipped ({st.skipped_steps} so far; run.on_nonfinite=skip)")


class GraphStep(StepRunner):
    """The whole training step as one CUDA graph per phase shape (`run.cuda_graph`), or the same code run eagerly.

    Per step, outside the graph: the loader's batch is copied into static input buffers, each group's lr and
    momentum (floats, set by the trainer) are written into 0-dim device tensors, and the step's loss, non-finite
    flag, fp16 scale and gradient norm are copied out of static outputs (`settle` reads the flags later). Inside:
    forward, backward (with the allreduce backend's hooks), GradScaler's unscale and inf check, the gradient norm and
    its clip, the optimizer step reading the tensor lr and momentum, the scale update. Without `capture` the same
    body runs eagerly every step (the CPU tests run it).

    With `capture` (a CUDA device; the trainer decides, `graph_decision`):
    - `warmup` steps of each new capture key (input shape and dtype, and the backend's `capture_key()`) run eagerly
      on one side stream, then the step is captured into a fresh memory pool and replayed. A phase change or a new
      backend plan drops the old graph and captures again: a pool is never reused, because a library workspace
      allocated inside a capture (cuBLAS's) keeps its pool alive after its graph is gone.
    - Every rank agrees that its capture succeeded (one watched all_reduce) before the first replay: a capture that
      fails on one rank stops every rank with the same line instead of leaving the others in collectives that wait
      for it. There is no fallback to eager in the same process.
    - Replayed collectives are not watched by the process group's watchdog, so `settle` issues a watched collective
      before it reads replayed results: a dead peer fails within `dist.timeout_s` instead of blocking the host.
    - The host runs at most `ahead` steps ahead of the device (a ring of events), and each loader batch is held
      until the event after its copy into the static buffers has completed. That wait polls its event with a
      deadline of `dist.timeout_s`: a replayed collective whose peer died never completes, and nothing else watches
      it, so on expiry the process groups are aborted and the step stops with one line naming the wait.
    A step of several micro-batches (accumulation) runs StepRunner's eager step.
    """

    def __init__(self, *, capture: bool, warmup: int = 3, ahead: int = 2, dist: DistInfo | None = None, **kw):
        super().__init__(**kw)
        if not self.optim.skips_on_device:
            raise TrainingError(
                f"optim.name={self.optim.name} decides on the host whether to step; it cannot run as one graph"
            )
        if capture and not self.optim.tensor_hparams:
            raise TrainingError(
                f"optim.name={self.optim.name} reads lr/momentum on the host: a CUDA graph would freeze them"
            )
        self.capture, self.warmup, self.ahead, self.dist = capture, warmup, ahead, dist
        if capture and self.amp_ctx is not nullcontext:
            # autocast's cache of cast weights would be freed at the end of the capture (torch's CUDA-graph notes)
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[kw.get("amp", "none")]
            self.amp_ctx = lambda: torch.autocast(self.device.type, dtype=dtype, cache_enabled=False)
        groups = self.optimizer.param_groups
        self.hp = [{k: torch.zeros((), device=self.device) for k in ("lr", "momentum") if k in g} for g in groups]
        self.key = None  # (input shape and dtype, the backend's capture key) of the current graph
        self.graph = None  # the current key's CUDA graph, once captured
        self.static: tuple = ()  # the current shape's input buffers and (loss, flag, scale, grad norm) output
        self.seen = 0  # eager steps of the current key so far
        self.said: str | None = None  # the last reason logged for running eager
        self.side = torch.cuda.Stream(self.device) if capture else None  # the eager steps' one side stream
        self.inflight: deque = deque()  # (event after the step, the step, its batch) of steps the device may still run
        self.replayed = 0  # replays since the last watched collective

    def _body(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        """One step on the static inputs; writes (loss, non-finite flag, fp16 scale before the step, gradient norm)
        into `out`."""
        self.optimizer.zero_grad(set_to_none=True)  # no kernel: the fresh gradients are the step's (graph's) own
        with self.amp_ctx():
            loss = self.criterion(self.train_model(x), y)
        self.scaler.scale(loss).backward()
        groups = self.optimizer.param_groups
        floats = [{k: g[k] for k in hp} for g, hp in zip(groups, self.hp, strict=True)]
        for g, hp in zip(groups, self.hp, strict=True):
            g.update(hp)  # the step reads the device tensors (a replay reads the values they hold then)
        try:
            if self.scaler.is_enabled():
                scale_before = self.scaler._get_scale_async().reshape(()).clone()
                self.scaler.unscale_(self.optimizer)
                norm = self.grad_norm()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                flag = (self.scaler._get_scale_async().reshape(()) < scale_before).float()
            else:
                scale_before = torch.zeros((), device=out.device)
                norm = self.grad_norm()
                flag = self.nonfinite_flag(norm)
                self.optimizer.found_inf = flag
                try:
                    self.optimizer.step()
                finally:
                    del self.optimizer.found_inf
                flag = flag.reshape(())
        finally:
            for g, saved in zip(groups, floats, strict=True):
                g.update(saved)  # the groups keep plain floats: checkpoints and logs see what they always saw
        out.copy_(
            torch.stack([loss.detach().float().reshape(()), flag, scale_before.float(), norm.float().reshape(())])
        )

    def __call__(self, x: torch.Tensor, y: torch.Tensor, st, log=None, micro_batches: int = 1) -> dict:
        if micro_batches != 1:  # accumulation: the eager step (a phase the trainer's decision keeps eager)
            return super().__call__(x, y, st, log, micro_batches)
        self._bound_run_ahead(st.step)
        ask = getattr(self.comm, "capture_key", None)
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, None if ask is None else ask())
        if key != self.key:  # a new phase or backend plan: new static buffers, captured again (old graph dropped)
            self.key, self.seen, self.graph = key, 0, None
            self.static = (torch.empty_like(x), torch.empty_like(y), torch.zeros(4, device=x.device))
        graph, (xs, ys, out) = self.graph, self.static
        xs.copy_(x, non_blocking=True)
        ys.copy_(y, non_blocking=True)
        for g, hp in zip(self.optimizer.param_groups, self.hp, strict=True):
            for k, t in hp.items():
                t.fill_(g[k])
        ready = self.capture and self._comm_ready(log)
        what = f"gradient allreduce (comm.backend={self.backend})"
        with collective_guard(what, st.step, self.timeout_s):
            if graph is not None and ready:
                graph.replay()
                self.replayed += 1
            elif ready and self.seen >= self.warmup:
                self._capture(xs, ys, out, st.step, log)
                self.replayed += 1
            else:
                self._eager(xs, ys, out)
                self.seen += 1
        saved = out.clone()
        if self.capture:  # the batch lives until the device has copied it
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.inflight.append((event, st.step, x, y))
        loss, flag, scale, norm = saved.unbind()
        self.pending.append((st.step, st.epoch, flag, loss, scale if self.scaler.is_enabled() else None))
        st.step += 1
        st.epoch_step += 1
        self.comm.on_step_end(st.step, log)
        return {LOSS.name: loss, GRAD_NORM.name: norm}

    def _bound_run_ahead(self, step: int) -> None:
        """Wait until at most `ahead` - 1 earlier steps may still run on the device (the host stays close: the
        loader's zero-copy buffers are reused a few batches later). Each wait polls its event for at most
        `dist.timeout_s`: `event.synchronize()` would block forever behind a replayed collective of a dead peer."""
        while len(self.inflight) >= self.ahead:
            event, done, _, _ = self.inflight[0]
            deadline, pause = time.monotonic() + self.timeout_s, 1e-5
            while not event.query():
                if time.monotonic() >= deadline:
                    abort_process_groups()  # NCCL: ends the kernels that wait for the dead peer
                    raise TrainingError(
                        f"run.cuda_graph: step {step}: the run-ahead wait for step {done} to finish on the device "
                        f"took over dist.timeout_s={self.timeout_s:g}: a peer is dead or hung in a replayed "
                        "collective; process groups aborted"
                    )
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)  # a GPU-bound step finishes within a step's time: poll finely first
            self.inflight.popleft()

    def settle(self, st, log) -> None:
        """A watched collective first when graphs were replayed since the last one (their collectives are not
        watched: a dead peer would block the host read below forever), then StepRunner's settle."""
        if self.replayed and self.pending:
            what = "the CUDA-graph steps' check (watched all_reduce before reading replayed results)"
            failed_ranks(False, self.dist, what, st.step, self.timeout_s)
            self.replayed = 0
        super().settle(st, log)

    def _comm_ready(self, log) -> bool:
        """Whether the allreduce backend's work can be captured now (multistream: not while its tuner measures);
        one line per new reason for running eager."""
        ask = getattr(self.comm, "capture_blocker", None)
        why = None if ask is None else ask()
        if why is not None and why != self.said:
            self.said = why
            msg = f"run.cuda_graph: step runs eager: {why}"
            log.info(msg) if log is not None else print(msg, flush=True)
        return why is None

    def _eager(self, xs, ys, out) -> None:
        if not self.capture:
            self._body(xs, ys, out)
            return
        # Warm-up before a capture, on the side stream (torch's CUDA-graph notes: cuDNN/cuBLAS workspaces, lazy state)
        main = torch.cuda.current_stream(self.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            self._body(xs, ys, out)
        main.wait_stream(self.side)

    def _capture(self, xs, ys, out, step: int, log) -> None:
        graph, error = torch.cuda.CUDAGraph(), None
        self.optimizer.zero_grad(set_to_none=True)
        # A fresh pool (pool=None): reusing a dropped graph's pool trips the allocator while a block of it lives.
        # thread_local: other threads (the input pipeline's) may keep calling CUDA while this thread captures.
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._body(xs, ys, out)
        except Exception as e:  # agreed below with every rank before anyone replays
            error = e
            msg = f"run.cuda_graph: this rank's capture failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            log.warn(msg) if log is not None else print(msg, flush=True)
        what = "run.cuda_graph's capture check (all_reduce of every rank's result)"
        bad = failed_ranks(error is not None, self.dist, what, step, self.timeout_s)
        if bad:
            raise TrainingError(
                f"run.cuda_graph: capturing the training step for input {list(xs.shape)} failed on rank(s) "
                f"{', '.join(map(str, bad))}; set run.cuda_graph=false to run every step eagerly"
            ) from error
        self.graph = graph
        graph.replay()  # capturing ran nothing: this is the step
        if log is not None:
            log.info(f"run.cuda_graph: step captured for input {list(xs.shape)} ({xs.dtype})")


def total_grad_norm(model: nn.Module, device: torch.device) -> torch.Tensor:
    """The total L2 norm of `model`'s gradients: one foreach norm over them all (0-dim, on the device)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    return torch.nn.utils.get_total_norm(grads, foreach=True)


def graph_decision(
    run,
    comm,
    *,
    optim: str,
    device_type: str,
    world_size: int,
    micro_batches: int = 1,
    dali: bool = False,
    proofs: list[proofs_.Proof] | None = None,
) -> tuple[bool, str]:
    """(capture the step as a CUDA graph?, why not) for one phase, from the run section, the comm section, the
    optimizer's name, the device type, the world size, the phase's micro-batches per step and whether DALI feeds
    it. Each part's record (base/registry.py) says whether it can be captured; run.cuda_graph=true captures what
    can be, auto (the default) only where a GPU proof of every part covers the run's scope (recipes/proofs.py;
    `proofs`: docs/data/gpu-proofs.json unless given), false nothing."""
    if run.cuda_graph is False:
        return False, "run.cuda_graph=false"
    registry.check_name(registry.OPTIMIZERS, optim, "optim.name", "optimizer")  # a config built in code
    opt = registry.OPTIMIZERS[optim]
    back = registry.ALLREDUCE_BACKENDS.get(comm.backend)
    if back is None:  # a backend built in code without a record states nothing it could be captured with
        return False, f"comm.backend={comm.backend} has no record in base/registry.py"
    wraps = world_size > 1 or comm.engage_single_rank  # the backend wraps the model (recipes/comm backends' prepare)
    reasons = [
        (device_type != "cuda", f"no CUDA device ({device_type})"),
        (micro_batches > 1, f"gradient accumulation ({micro_batches} micro-batches: run.accumulate/max_gpu_batch)"),
        (run.compile != "none", f"run.compile={run.compile} (inductor handles its own graphs)"),
        (not opt.skips_on_device, f"optim.name={optim} decides on the host whether to step"),
        (opt.skips_on_device and not opt.tensor_hparams, f"optim.name={optim} reads lr/momentum on the host"),
        (wraps and bool(back.graph_refusal), f"comm.backend={comm.backend} wraps the model ({back.graph_refusal})"),
        # the hop ring (and under comm.hierarchy=host its staging through pinned host copies) runs on helper threads
        # that wait on the host: such phases stay eager (multistream's capture_blocker says the same at run time)
        (wraps and _hop_ring(comm), "comm.balance_level=hop: its ring runs on helper threads that wait on the host"),
    ]
    why = [r for bad, r in reasons if bad]
    if not why and run.cuda_graph == "auto":
        parts = [f"optim.name={optim}"] + ([f"comm.backend={comm.backend}"] if wraps else [])
        scope = proofs_.Scope(world_size=world_size, dali=dali, torch=torch.__version__)
        known = proofs_.load_proofs() if proofs is None else proofs
        missing = [m for m in (proofs_.missing_scope(p, scope, known) for p in parts) if m is not None]
        if missing:
            why.append(
                f"no GPU proof covers this run ({'; '.join(missing)}; run.cuda_graph=true captures it; docs/gpu.md)"
            )
    return (False, "; ".join(why)) if why else (True, "")


def _hop_ring(comm) -> bool:
    return bool(getattr(comm, "balance", False)) and getattr(comm, "balance_level", "") == "hop"


def phase_graph_decisions(
    run,
    comm,
    *,
    optim: str,
    micro_batches: list[int],
    device_type: str,
    world_size: int,
    dali: bool = False,
    proofs: list[proofs_.Proof] | None = None,
) -> list[tuple[bool, str]]:
    """`graph_decision` for each phase, given each phase's micro-batches per step (recipes.schedule.Schedule)."""
    known = proofs_.load_proofs() if proofs is None else proofs
    kw = dict(optim=optim, device_type=device_type, world_size=world_size, dali=dali, proofs=known)
    return [graph_decision(run, comm, micro_batches=m, **kw) for m in micro_batches]


def after_backend(decisions: list[tuple[bool, str]], comm) -> list[tuple[bool, str]]:
    """The phases' decisions once the allreduce backend is prepared: where it blocks capture for good
    (`capture_blocked_for_good`: multistream's hop ring, serialize, communicators a graph would serialize), every
    phase eager with that reason, so the trainer builds StepRunner (float lr/momentum, no static input copy, no
    run-ahead wait) rather than a GraphStep that would run its eager body for the whole run."""
    if not any(ok for ok, _ in decisions):
        return decisions
    ask = getattr(comm, "capture_blocked_for_good", None)
    why = None if ask is None else ask()
    if why is None:
        return decisions
    return [(False, f"{why}; capture can never happen in this run") for _ in decisions]


def describe_graph_decisions(cuda_graph, phases, decisions: list[tuple[bool, str]]) -> list[str]:
    """One line per phase: 'phase 0 (96 px): captured ...' or 'phase 0 (96 px): eager: <why>'."""
    return [
        f"run.cuda_graph={str(cuda_graph).lower()}: phase {i} ({p.image_size} px): "
        + ("captured (one CUDA graph)" if ok else f"eager: {why}")
        for i, (p, (ok, why)) in enumerate(zip(phases, decisions, strict=True))
    ]
