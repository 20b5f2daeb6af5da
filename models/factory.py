"""Networks built with timm. The trainer asks for `create_model(cfg.model, num_classes)` and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import timm
import torch
from torch import nn

from base.errors import CheckpointError, ConfigError
from base.registry import MODELS, check_name


def create_model(cfg, num_classes: int) -> nn.Module:
    """Build `cfg.name` for `num_classes` classes with the configured settings its record reads (the BN ones for a
    network with BatchNorm residual blocks)."""
    check_name(MODELS, cfg.name, "model.name", "model")
    record = MODELS[cfg.name]
    extra = {"zero_init_last": cfg.zero_init_last_bn} if "zero_init_last_bn" in record.reads else {}
    model = timm.create_model(record.arch, pretrained=False, num_classes=num_classes, drop_rate=cfg.drop_rate, **extra)
    if "bn_momentum" in record.reads:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = cfg.bn_momentum
                m.eps = cfg.bn_eps
    return model


def describe_model(model: nn.Module) -> dict:
    """Identity used to refuse a checkpoint from a different network: parameter names and shapes."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return {"num_params": sum(p.numel() for p in model.parameters()), "shapes": shapes}


def check_compatible(model: nn.Module, state: dict, source: str) -> None:
    """Raise a clear error when a checkpoint's state_dict does not fit `model`."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(own[k].shape) != tuple(torch.as_tensor(state[k]).shape)]
    if missing or extra or wrong:
        detail = []
        if missing:
            detail.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if extra:
            detail.append(f"{len(extra)} unexpected (e.g. {extra[0]})")
        if wrong:
            k = wrong[0]
            detail.append(f"{len(wrong)} of other shape (e.g. {k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)})")
        raise CheckpointError(f"{source}: checkpoint was made for a different model: {'; '.join(detail)}")


def compile_unavailable(device: torch.device) -> str | None:
    """Why inductor cannot compile for `device` on this machine (None when it can): on CPU it needs a C++ compiler."""
    if device.type != "cpu":
        return None
    import shutil

    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx[-1] if isinstance(inductor_config.cpp.cxx, tuple) else inductor_config.cpp.cxx
    candidates = [os.environ.get("CXX"), cxx, "g++", "c++", "clang++"]
    if any(c and shutil.which(c) for c in candidates):
        return None
    return "inductor on CPU needs a C++ compiler (none of g++, c++, clang++ or $CXX is on PATH)"


# Compile seconds as dynamo and inductor count them: the forward's compile (dynamo tracing, AOTAutograd, inductor)
# and the backward's, which AOTAutograd compiles lazily at the first backward.
_COMPILE_METRICS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")
_CACHE_COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"))
_CACHE_COUNTERS += (("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"))


def compile_cache_dir(setting: str) -> Path | None:
    """The folder `run.compile_cache` names ('auto': ~/.cache/dawnbench/compile, or under XDG_CACHE_HOME), None for
    'off'."""
    if setting == "off":
        return None
    if setting == "auto":
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dawnbench" / "compile"
    return Path(setting).expanduser()


def use_compile_cache(setting: str) -> Path | None:
    """Point inductor's persistent caches (FX graphs, AOTAutograd, Triton kernels: all under
    TORCHINDUCTOR_CACHE_DIR) at `run.compile_cache`, so that a second run on this machine loads its compiled step
    instead of compiling it; 'off' turns both graph caches off (every compile cold)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    folder = compile_cache_dir(setting)
    inductor_config.fx_graph_cache = folder is not None
    functorch_config.enable_autograd_cache = folder is not None
    if folder is not None:
        if any(c.isspace() for c in str(folder)):
            # Inductor passes the folder to g++ unquoted (torch 2.14): a space splits it and the CPU build fails.
            raise ConfigError(f"run.compile_cache={setting}: a folder without spaces is needed (inductor's C++ build)")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"run.compile_cache={setting}: cannot create '{folder}': {e.strerror}") from None
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return folder


class CompileClock:
    """Compile seconds and cache hits per input shape of a compiled module, read from dynamo's and inductor's own
    counters. Called before every forward (a forward pre-hook): a shape's first call opens its entry, the next call
    closes it, so that the lazily compiled backward of that first step is counted too."""

    def __init__(self):
        self.shapes: dict[str, dict] = {}
        self._open: tuple[str, float, dict] | None = None

    @staticmethod
    def _now() -> tuple[float, dict]:
        from torch._dynamo.utils import compilation_time_metrics, counters

        seconds = sum(sum(compilation_time_metrics.get(k, [])) for k in _COMPILE_METRICS)
        return seconds, {f"{a}.{b}": counters[a][b] for a, b in _CACHE_COUNTERS}

    def _close(self) -> None:
        if self._open is None:
            return
        key, s0, c0 = self._open
        s1, c1 = self._now()
        d = {k: c1[k] - c0[k] for k in c1}
        hits = d["inductor.fxgraph_cache_hit"] + d["aot_autograd.autograd_cache_hit"]
        misses = d["inductor.fxgraph_cache_miss"] + d["aot_autograd.autograd_cache_miss"]
        cache = "warm" if hits and not misses else ("cold" if not hits else "partial")
        self.shapes[key] = {"compile_s": round(s1 - s0, 3), "cache": cache, "cache_hits": hits, "cache_misses": misses}
        self._open = None

    def __call__(self, module, args) -> None:
        self._close()
        x = args[0] if args else None
        key = "x".join(str(n) for n in x.shape) if isinstance(x, torch.Tensor) else "?"
        if key not in self.shapes:
            self._open = (key, *self._now())

    def report(self) -> dict:
        """{input shape 'NxCxHxW': {compile_s, cache: cold|warm|partial, cache_hits, cache_misses}}."""
        self._close()
        return dict(self.shapes)


def compile_report(module: nn.Module) -> dict:
    """The summary's `compile` entry for a module from `compile_for_training` ({} when it was not compiled)."""
    clock = getattr(module, "_compile_clock", None)
    return {"compile": clock.report()} if clock is not None else {}


def compile_for_training(module: nn.Module, mode: str, *, shapes: int = 1, cache: str = "auto") -> nn.Module:
    """`module` under torch.compile (inductor) in `mode`, or `module` itself when `mode` is 'none'.

    Shapes are static (`dynamic=False`): each phase's image and batch size is compiled once, with kernels
    specialised to it, instead of one shape-generic graph; `shapes` (the distinct input shapes of the plan) raises
    dynamo's recompile limit so that no phase falls back to eager. The result shares its parameters and buffers
    with `module`, whose state_dict (no `_orig_mod.` prefix) is what checkpoints keep.
    """
    if mode == "none":
        return module
    import torch._dynamo

    dyn = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name differs across torch versions and can be hidden
        try:
            setattr(dyn, name, max(getattr(dyn, name), shapes + 1))
            break
        except AttributeError:
            continue
    use_compile_cache(cache)
    compiled = torch.compile(module, mode=mode, dynamic=False)
    # The hook runs outside the compiled frame (on the OptimizedModule, before dynamo sees the call).
    compiled._compile_clock = CompileClock()
    compiled.register_forward_pre_hook(compiled._compile_clock)
    return compiled
