"""`comm.backend: multistream`: balanced fused buckets, each sliced over K communicators, no per-step negotiation.

This module sets the backend up (plan check across ranks, the auto-tuner, stats and state); the per-step work,
gradient hooks to launched buckets to averaged `.grad`, is engine.py's `_Engine` (read its docstring for how a step
goes, plan.py for the plan itself); the balancer's windows and re-plans between steps are balance_steps.py's.

K communicators are process groups created once, in the same order on every rank (communicators.py): with NCCL
each has its own CUDA stream, with gloo its own TCP connections (so K flows on the wire); how the engine issues
slices on them is `comm.concurrency` (engine.py: `serialize`, one in flight at a time, or `overlap`), decided at
start-up by recipes/comm/concurrency.py from the transport and the settings that would break the rule overlap
relies on.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.distributed as td
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from base.errors import ConfigError, PlanMismatchError
from recipes.comm import balance as balancing
from recipes.comm import communicators, concurrency, flowrates, hierarchy, ncclenv
from recipes.comm import tuner as tuning
from recipes.comm.balance_steps import BalanceSteps
from recipes.comm.base import BackendDefaults
from recipes.comm.engine import _Engine
from recipes.comm.plan import FusionPlan, Settings, build_plan, grad_specs
from recipes.comm.stats import CommStats
from recipes.distributed import all_gather_object, broadcast_object, collective_guard


class MultiStreamBackend(BalanceSteps, BackendDefaults):
    name = "multistream"

    def __init__(self, comm, dist, **named):
        super().__init__(comm, dist, **named)
        self._held = False  # inside no_sync: the hooks leave the gradients local
        c = comm
        for key in ("streams", "slices", "tune_max_candidates", "tune_steps_per_window", "tune_windows"):
            if getattr(c, key) < 1:
                raise ConfigError(f"comm.{key}: expected a positive integer, got {getattr(c, key)}")
        if c.tune_warmup_steps < 0:
            raise ConfigError(f"comm.tune_warmup_steps: expected 0 or more, got {c.tune_warmup_steps}")
        if c.bucket_mb <= 0:
            raise ConfigError(f"comm.bucket_mb: expected a positive number, got {c.bucket_mb}")
        for key in ("tune_bucket_mb", "tune_streams", "tune_slices"):
            values = getattr(c, key)
            if not values or any(v <= 0 for v in values):
                raise ConfigError(f"comm.{key}: expected a non-empty list of positive numbers, got {values}")
        self.settings = Settings(float(c.bucket_mb), c.streams, c.slices)
        self.engine: _Engine | None = None
        self.tuner: tuning.AutoTuner | None = None
        self.groups: list = []  # the communicators, as this rank sends on them
        self.recv_groups: list = []  # as it receives on them: the same, but under hop level at 2 ranks (one_way)
        self.links: list = []  # comm.balance_level=hop: per communicator, the TCP connection the ring sends on
        self.recv_links: list = []  # ... and the one it receives on
        self._resumed: Settings | None = None
        self._resumed_balance: dict | None = None
        self.balance: balancing.BalanceState | None = None  # comm.balance, once the tuner (if any) has chosen
        self._steps = 0  # steps whose times are read
        self._sync_seconds = 0.0
        self._wait_seconds = 0.0
        self._bytes = 0
        self.concurrency: concurrency.Decision | None = None
        self._hop = bool(c.balance) and c.balance_level == "hop"  # the hop-balanced ring (recipes/comm/hopring.py)
        self.hierarchy: hierarchy.Hierarchy | None = None  # comm.hierarchy=host: the ring between hosts only
        # the hop balancer's test of each re-plan: the window's mean step (host clock between on_step_end calls),
        # and (the plan before the re-plan, its window's step) until the next window says whether it stays
        self._hop_mark: float | None = None
        self._hop_elapsed = 0.0
        self._hop_trial: tuple | None = None
        self.graph_serial: list[str] = []

    @classmethod
    def process_env(cls, comm) -> dict[str, str]:
        """NCCL's implicit launch order (the rule of `overlap`) and the multi-flow settings, unless already set."""
        env = {**super().process_env(comm), **ncclenv.process_env(comm, log=ncclenv.rank0_print)}
        return {**env, **concurrency.process_env(comm.concurrency)}

    # -- set-up -----------------------------------------------------------------------------------------
    def prepare(self, model: nn.Module, optimizer):
        if self.dist.world_size == 1 and not self.comm_cfg.engage_single_rank:
            return model, optimizer  # nothing to reduce
        c = self.comm_cfg
        self.specs, self.params = grad_specs(model)
        want_tuning = c.autotune and self._resumed is None
        start = self._resumed or self.settings
        if want_tuning:
            cached = self._cached_winner()
            if cached is not None:
                start = cached
            else:
                space, predicted, note = self._distinct_plans(), None, ""
                if c.tune_start == "model":
                    ranked, note = self._model_start(space)
                    predicted, start = dict(ranked), ranked[0][0]
                    self.settings = start
                self.tuner = tuning.AutoTuner(
                    space,
                    self.settings,
                    max_candidates=c.tune_max_candidates,
                    warmup_steps=c.tune_warmup_steps,
                    steps_per_window=c.tune_steps_per_window,
                    windows=c.tune_windows,
                    method=c.tune_method,
                    predicted=predicted,
                    start_note=note,
                )
                self._note(
                    f"multistream autotune: up to {self.tuner.max_candidates} candidates ({c.tune_method}), "
                    f"{c.tune_warmup_steps} warm-up steps, then {self.tuner.steps_per_trial} steps each"
                )
        # every rank's facts (driver, NCCL, MPS, environment), agreed: the same mode and slices on every host
        gathered = all_gather_object((socket.gethostname(), concurrency.probe(td.get_backend())), self.dist)
        hosts, facts = [h for h, _ in gathered], [f for _, f in gathered]
        # graph_serial: captured NCCL collectives would not overlap on some rank
        self.concurrency, self.graph_serial = concurrency.agree(c.concurrency, facts, hosts)
        # the same rule as the advice's (scripts/predict_balance.py never names a setting refused here)
        why = flowrates.refusal(
            balance=bool(c.balance), level=c.balance_level, hierarchy=c.hierarchy, transport=td.get_backend()
        )
        if why is not None:
            raise ConfigError(why)
        if self._hop:
            if c.hierarchy == "host":
                d = self.dist
                everyone = all_gather_object((d.local_rank, d.local_world_size), d)
                lay = hierarchy.layout_of(d.rank, d.world_size, d.local_rank, d.local_world_size, everyone)
                self.hierarchy = hierarchy.Hierarchy(lay, self.timeout_s, d.device)
                self._note(
                    f"multistream balance: hierarchical, {td.get_backend()} inside each host ({lay.local} ranks), "
                    f"a hop-balanced ring per local rank between the {lay.hosts} hosts on the K communicators"
                )
            else:
                self._note("multistream balance: hop level, a ring of point-to-point sends on the K communicators")
        else:
            self._note(f"multistream concurrency: {self.concurrency.why}")
        shares = None
        if c.balance and not self._hop and self.concurrency.mode == "serialize":
            self._note("multistream balance: off under comm.concurrency=serialize (one collective in flight at a time)")
        elif c.balance and self._resumed_balance:
            hops = self.dist.world_size if self._hop else 0
            try:
                self.balance = balancing.BalanceState.from_state(start.streams, self._resumed_balance, hops)
                shares = self.balance.shares
            except ValueError as e:
                self._note(f"{e}: the balancer starts again from equal shares")
        plan = self._verified_plan(start, shares)  # before anything else, so a mismatch fails fast
        _broadcast_states(model)
        streams = [start.streams] + ([s.streams for s in self.tuner.space] if self.tuner is not None else [])
        self._create_groups(max(streams))
        self._start(plan)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(partial(self._grad_ready, i))
        return model, optimizer

    def _model_start(self, space: list[Settings]) -> tuple:
        """Rank 0 ranks the space with the step-time model (it reads the files and builds the model's FLOP profile,
        once) and tells everyone; a bad link or profile file fails every rank with rank 0's message."""
        d = self.dist
        hosts, gpus = d.world_size // max(d.local_world_size, 1), max(d.local_world_size, 1)
        box: list = [None]
        if d.is_main:
            gpu = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else None
            try:
                box = [
                    tuning.model_start(
                        self.comm_cfg, self.specs, space, hosts, gpus, gpu, compute_start=self.compute_start
                    )
                ]
            except ConfigError as e:
                box = [str(e)]
        box = [broadcast_object(box[0], self.dist)]  # in the collective guard: a dead peer is one line
        if isinstance(box[0], str):
            raise ConfigError(box[0])
        return box[0]

    def _distinct_plans(self) -> list[Settings]:
        """The search space, less settings whose plan is identical to an earlier one (e.g. two bucket sizes that
        both leave every tensor alone), so no candidate is measured twice."""
        c = self.comm_cfg
        seen: dict[str, Settings] = {}
        for s in [self.settings, *tuning.search_space(c.tune_bucket_mb, c.tune_streams, c.tune_slices)]:
            seen.setdefault(build_plan(self.specs, s, c.compression).digest(), s)
        return list(seen.values())

    @property
    def one_way(self) -> bool:
        """The hop-balanced ring at 2 ranks: K groups to send on, K others to receive on (communicators.one_way)."""
        return communicators.one_way(self.dist, self.hierarchy, hop=self._hop)

    def _create_groups(self, k: int) -> None:
        """The K communicators (recipes/comm/communicators.py), connected and checked now."""
        made = communicators.connect(
            k, dist=self.dist, timeout_s=self.timeout_s, hop=self._hop, hierarchy=self.hierarchy
        )
        self.groups, self.recv_groups = made.groups, made.recv_groups
        self.links, self.recv_links = made.links, made.recv_links

    def _plan(self, settings: Settings, shares: tuple | None = None) -> FusionPlan:
        """The plan for `settings`: under comm.balance_level=hop every bucket goes to the ring, cut by the hop table
        `shares` (equal shares until the first re-plan); otherwise `shares` is the communicators' (None: static)."""
        if self._hop:
            table = shares or balancing.even_table(self.dist.world_size, settings.streams)
            return build_plan(self.specs, settings, self.comm_cfg.compression, hop_shares=table)
        return build_plan(self.specs, settings, self.comm_cfg.compression, shares)

    def _verified_plan(self, settings: Settings, shares: tuple | None = None) -> FusionPlan:
        """The plan for `settings`, after checking that every rank derived the same one (one all-gather)."""
        plan = self._plan(settings, shares)
        mine = (plan.digest(), plan.describe())
        everyone = all_gather_object(mine, self.dist)
        differ = [r for r, (h, _) in enumerate(everyone) if h != everyone[0][0]]
        if differ:
            lines = "; ".join(f"rank {r}: {h[:12]} ({d})" for r, (h, d) in enumerate(everyone) if r in [0, *differ])
            raise PlanMismatchError(
                f"multistream: ranks derived different fusion plans ({lines}). Every rank must run the same "
                "model, config and code version"
            )
        return plan

    def _start(self, plan: FusionPlan) -> None:
        if self.engine is not None:
            self._account(self.engine.read(wait=True))  # the old plan's last steps, before its marks are dropped
            self.engine.close()
        self.engine = _Engine(
            plan,
            self.params,
            self.groups[: plan.streams],
            self.dist.world_size,
            self.concurrency.mode == "serialize" and not self._hop,
            self.timeout_s,
            rank=self.dist.rank,
            links=self.links[: plan.streams],
            recv_links=self.recv_links[: plan.streams],
            recv_groups=self.recv_groups[: plan.streams],
            hierarchy=self.hierarchy,
        )
        self.settings = plan.settings
        self._note(f"multistream plan {plan.digest()[:12]}: {plan.describe()}, concurrency {self.concurrency.mode}")

    def _grad_ready(self, i: int, param: torch.Tensor) -> None:
        if not self._held:
            self.engine.grad_ready(i)

    def capture_blocker(self) -> str | None:
        """Whether the engine's work may be captured in a CUDA graph now (recipes/steps.py's GraphStep): not while
        the tuner measures steps, nor under `serialize` (its helper thread synchronises on the host). From then on
        the engine marks no times: a replayed step runs no Python, so the stats cover the eager steps only."""
        if self.engine is None:
            return None
        if self.tuner is not None and not self.tuner.done:
            return "the multistream tuner measures eager steps"
        if self.hierarchy is not None:  # the trainer keeps the phase eager: the ring runs on the host's CPUs
            return "comm.hierarchy=host (its ring between hosts runs on pinned host copies, on helper threads)"
        if self._hop:
            return "comm.balance_level=hop (its ring's helper thread waits on the host)"
        if self.concurrency.mode == "serialize":
            return "comm.concurrency=serialize (its helper thread waits on the host)"
        if self.graph_serial and self.engine.plan.streams > 1:
            return f"{self.engine.plan.streams} communicators would run one at a time inside a graph: " + "; ".join(
                self.graph_serial
            )
        if self._balancing():
            return "the multistream balancer measures eager steps"
        self.engine.timing = False
        return None

    def capture_blocked_for_good(self) -> str | None:
        """Why no step of this run can ever be captured (None: it may be, once the tuner and balancer are done): the
        hop ring and `serialize` wait on the host, and K communicators a graph would serialize stay K when no tuner
        can change them. The trainer then builds StepRunner instead of GraphStep."""
        if self.engine is None:
            return None
        if self._hop:
            return "comm.balance_level=hop (its ring's helper thread waits on the host)"
        if self.concurrency.mode == "serialize":
            return "comm.concurrency=serialize (its helper thread waits on the host)"
        if self.graph_serial and self.tuner is None and self.engine.plan.streams > 1:
            why = "; ".join(self.graph_serial)
            return f"{self.engine.plan.streams} communicators would run one at a time inside a graph: {why}"
        return None

    def capture_key(self):
        """The plan's identity (settings and shares): a captured step replays one plan's buffers and communicators,
        so recipes/steps.py's GraphStep captures again when a re-plan changes it (re-plans happen between steps
        only, in on_step_end)."""
        if self.engine is None:
            return None
        return (self.settings, self.engine.plan.shares, self.engine.plan.hop_shares)

    @contextmanager
    def no_sync(self, model: nn.Module):
        """The hooks skip the engine: gradients accumulate in `.grad`, and the next backward pass reduces the sum."""
        self._held = True
        try:
            yield
        finally:
            self._held = False

    # -- the tuner --------------------------------------------------------------------------------------
    def _cache_path(self):
        c = self.comm_cfg.tune_cache
        if c is None:
            return None
        return Path(c).expanduser() if c else tuning.default_cache_path()

    def _cache_key(self) -> str:
        c, d = self.comm_cfg, self.dist
        network = c.network
        if network == "auto":
            ifname = os.environ.get("NCCL_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME") or "default"
            network = f"{d.world_size // max(d.local_world_size, 1)}nodes-x{d.local_world_size}-if:{ifname}"
        dtype = str(self.params[0].dtype).removeprefix("torch.")
        return tuning.cache_key(self.model_name, d.world_size, td.get_backend(), dtype, c.compression, network)

    def _cached_winner(self) -> Settings | None:
        """Rank 0 reads the cache and tells everyone (other machines may not have the file)."""
        found = None
        path = self._cache_path()
        if self.dist.is_main and path is not None:
            found = tuning.cache_load(path, self._cache_key())
        box = [found]
        box = [broadcast_object(box[0], self.dist)]  # in the collective guard: a dead peer is one line
        if box[0] is not None:
            self._note(
                f"multistream autotune: cached winner for {self._cache_key()} in {path}: {box[0].label()} "
                "(delete that entry, or set comm.tune_cache=null, to tune again)"
            )
        return box[0]

    def on_step_end(self, step: int, log=None) -> None:
        """Called by the trainer after every optimizer step; drives the auto-tuner during the first steps."""
        if self.engine is None:
            return
        self._bytes += sum(w.numel() * w.element_size() for w in self.engine.wire)  # sizes only: no sync
        tuner = self.tuner
        measuring = tuner is not None and not tuner.done
        # Tuning: wait for this step's last mark (one sync per step, during the tuning steps only). Otherwise only
        # the steps the GPU has finished are read, so the stats never stall it.
        times = self.engine.read(wait=measuring)
        self._account(times)
        if not measuring:
            self._balance_step(step, log)
            return
        if not times or not tuner.record(times[-1][0]):
            return
        trial = tuner.trials[-1]
        self._note(
            f"multistream autotune: candidate {len(tuner.trials)}: {trial.settings.label()}: median "
            f"backward+sync {trial.score * 1000:.1f} ms over {len(trial.window_means)} windows",
            log,
        )
        if log is not None:
            log.scalars(
                step,
                **{
                    "autotune/candidate_ms": trial.score * 1000,
                    "autotune/bucket_mb": trial.settings.bucket_mb,
                    "autotune/streams": trial.settings.streams,
                    "autotune/slices": trial.settings.slices,
                },
            )
        decision = [None, None]
        if self.dist.is_main:
            nxt = tuner.propose()
            decision = [nxt, None if nxt is not None else tuner.winner().settings]
        with collective_guard("multistream autotune: the next candidate", step, self.timeout_s):
            td.broadcast_object_list(decision, src=0)  # every rank switches at this same step boundary
        nxt, win = decision
        if nxt is not None:
            tuner.begin(nxt)
            self._start(self._verified_plan(nxt))
            return
        tuner.done = True
        best = next(t for t in tuner.trials if t.settings == win)
        self._note(
            f"multistream autotune: winner after {len(tuner.trials)} candidates: {win.label()} "
            f"({best.score * 1000:.1f} ms); {tuner.summary()}",
            log,
        )
        if log is not None:
            log.scalars(
                step,
                **{
                    "autotune/winner_ms": best.score * 1000,
                    "autotune/winner_bucket_mb": win.bucket_mb,
                    "autotune/winner_streams": win.streams,
                    "autotune/winner_slices": win.slices,
                },
            )
        path = self._cache_path()
        if self.dist.is_main and path is not None:
            tuning.cache_store(path, self._cache_key(), tuner)
            self._note(f"multistream autotune: winner cached in {path}", log)
        if win != self.settings:
            self._start(self._verified_plan(win))

    def _note(self, msg: str, log=None) -> None:
        if log is not None:
            log.info(msg)
        elif self.dist.is_main:
            print(msg, flush=True)

    # -- the backend interface --------------------------------------------------------------------------
    def _account(self, times: list[tuple[float, float]]) -> None:
        for step, wait in times:
            self._steps += 1
            self._sync_seconds += step
            self._wait_seconds += wait

    def stats(self) -> CommStats:
        """The engine's backward+sync window as comm_seconds, its wait after backward as wait_seconds."""
        if self.engine is None:
            return CommStats(self.name)
        self._account(self.engine.read(wait=True))
        c, s = self.comm_cfg, self.settings
        settings = {
            "bucket_mb": s.bucket_mb,
            "streams": s.streams,
            "slices": s.slices,
            "buckets": len(self.engine.plan.buckets),
            "compression": c.compression,
            "concurrency": self.concurrency.mode if self.concurrency else c.concurrency,
        }
        if self.tuner is not None:  # whether the settings above are its winner or a candidate it was measuring
            settings["tune_finished"] = self.tuner.done
            settings["tune_measured"] = len(self.tuner.trials)
            settings["tune_candidates"] = self.tuner.max_candidates
        if self.balance is not None:
            settings["balance_replans"] = self.balance.replans
            settings["balance_level"] = "hop" if self._hop else "communicator"
            settings["shares"] = balancing.listed(self.balance.current)
        return CommStats(self.name, self._steps, self._sync_seconds, self._wait_seconds, self._bytes, settings)

    def state_dict(self) -> dict:
        tuned = self.tuner is None or self.tuner.done
        if self.engine is None or not tuned:
            return {}
        s = self.settings
        out = {"bucket_mb": s.bucket_mb, "streams": s.streams, "slices": s.slices}
        if self.balance is not None:  # the re-planned shares: a resumed run installs the same plan on every rank
            out["balance"] = self.balance.to_state()
        return out

    def load_state_dict(self, state: dict) -> None:
        if state:
            self._resumed = Settings(float(state["bucket_mb"]), int(state["streams"]), int(state["slices"]))
            self._resumed_balance = state.get("balance")


def _broadcast_states(model: nn.Module) -> None:
    """Rank 0's parameters and buffers to every rank (as DDP does at construction), one flat tensor per dtype."""
    tensors = [t for t in [*model.parameters(), *model.buffers()] if t.numel() > 0]
    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for group in by_dtype.values():
            flat = _flatten_dense_tensors([t.data for t in group])
            td.broadcast(flat, src=0)
            for t, v in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
                t.data.copy_(v)
