"""`data.backend: dali`: NVIDIA DALI pipelines, one per phase, decoding on the GPU (nvJPEG) or on the CPU.

Training: `fn.readers.file` over this rank's sample order for the rest of the phase, taken from the sharding rule
every backend shares (data/sharding.py: one permutation per epoch, rank r takes every world-th sample, so the
ranks' files are disjoint and cover the set), decoding with the random crop fused into it (only the crop is
decoded), resize, random flip and normalize, NCHW or NHWC, float32 or float16. Every epoch takes exactly the
plan's number of full batches (the shard wraps around to fill the last one), and a run resumed mid-epoch
continues with exactly the samples the interrupted run had not reached yet. Validation: shards padded with
`pad_last_batch`, the padding cut off so that every image counts once; or rectangular validation
(data/rect.py). A phase switch releases the old pipelines (threads and buffers) before the new one is built.
Without a GPU the same graph runs on CPU operators (`device_id=None`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.math import max as math_max
from nvidia.dali.math import min as math_min

from base.errors import DataError
from data.check import _gather_problems, check_headers, quick_problem
from data.folder import Split
from data.pipeline import BasePipeline
from data.rect import image_sizes, plan_rect_batches, rank_rect_batches
from data.sharding import train_shard
from data.transforms import IMAGENET_MEAN, IMAGENET_STD, crop_min_area

READER = "Reader"
# nvJPEG buffers preallocated for ImageNet-sized images (NVIDIA's ResNet-50 example), so that decoding a
# large image does not reallocate mid-epoch.
_MIXED_PADDING = {"device_memory_padding": 211025920, "host_memory_padding": 140544512}


def output_dtype(dali_dtype: str, device: torch.device, *, amp: str) -> torch.dtype:
    """The dtype of the images a DALI pipeline hands to the model (`data.dali_dtype`; `amp`: run.amp)."""
    choice = dali_dtype
    if choice == "auto":
        choice = "float16" if device.type == "cuda" and amp == "fp16" else "float32"
    return torch.float16 if choice == "float16" else torch.float32


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def _decoder_args(gpu: bool, hw_load: float) -> dict:
    """The decoder's device and, on a GPU, the share of JPEG data for the hardware decoder (a mixed-only argument)."""
    return {"device": "mixed", "hw_decoder_load": hw_load} if gpu else {"device": "cpu"}


def _normalize(images, dtype, nhwc: bool, **crop):
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT16 if dtype == torch.float16 else types.FLOAT,
        output_layout="HWC" if nhwc else "CHW",
        mean=list(IMAGENET_MEAN),
        std=list(IMAGENET_STD),
        **crop,
    )


def _train_graph(*, files, labels, size, min_scale, gpu, dtype, nhwc, hw_load):
    # The order is decided in Python (data/sharding.py), so the reader only reads it as given.
    jpegs, labels = fn.readers.file(files=files, labels=labels, random_shuffle=False, name=READER)
    # RandomResizedCrop fused into the decode: only the crop window is decoded (ROI decoding).
    images = fn.decoders.image_random_crop(
        jpegs,
        **_decoder_args(gpu, hw_load),
        output_type=types.RGB,
        random_area=[min_scale, 1.0],
        random_aspect_ratio=[3 / 4, 4 / 3],
        num_attempts=10,
        adjust_orientation=False,
        **(_MIXED_PADDING if gpu else {}),
    )
    images = fn.resize(images, resize_x=size, resize_y=size, antialias=True)
    images = _normalize(images, dtype, nhwc, mirror=fn.random.coin_flip(probability=0.5))
    return images, labels.gpu() if gpu else labels


def _float(node):
    return fn.cast(node, dtype=types.FLOAT)


def _center(length, size: int):
    """crop_pos that puts the window where torchvision's center_crop does: offset round((length - size) / 2)."""
    d = math_max(length - size, 0)
    k = d // 2
    offset = k + (d % 2) * (k % 2)  # Python's round(): half to even
    return _float(offset) / _float(math_max(d, 1))


def _val_graph(*, files, labels, shard_id, num_shards, size, resize_to, gpu, dtype, nhwc, hw_load):
    jpegs, labels = fn.readers.file(
        files=files,
        labels=labels,
        shard_id=shard_id,
        num_shards=num_shards,
        pad_last_batch=True,
        stick_to_shard=True,
        name=READER,
    )
    # Sizes and crop window computed as torchvision's Resize(int) + CenterCrop do (longer side rounded down,
    # offset rounded half to even), so that both backends validate on the same pixels.
    shape = fn.peek_image_shape(jpegs, adjust_orientation=False)
    h, w = shape[0], shape[1]
    short = math_min(h, w)
    h, w = (h * resize_to) // short, (w * resize_to) // short
    images = fn.decoders.image(jpegs, **_decoder_args(gpu, hw_load), output_type=types.RGB, adjust_orientation=False)
    images = fn.resize(images, resize_y=_float(h), resize_x=_float(w), antialias=True)
    window = {"crop": (size, size), "crop_pos_y": _center(h, size), "crop_pos_x": _center(w, size)}
    images = _normalize(images, dtype, nhwc, **window)
    return images, labels.gpu() if gpu else labels


class _Cycle:
    """External-source callback: the rank's rectangular batch shapes, in reader order, forever."""

    def __init__(self, shapes: list[np.ndarray]):
        self.shapes, self.i = shapes, 0

    def __call__(self):
        batch = self.shapes[self.i % len(self.shapes)]
        self.i += 1
        return list(batch)


def _rect_val_graph(files, labels, shapes, *, gpu, dtype, nhwc, hw_load):
    jpegs, labels = fn.readers.file(files=files, labels=labels, pad_last_batch=True, name=READER)
    hw = fn.external_source(source=_Cycle(shapes), batch=True, dtype=types.FLOAT)
    images = fn.decoders.image(jpegs, **_decoder_args(gpu, hw_load), output_type=types.RGB, adjust_orientation=False)
    images = fn.resize(images, size=hw, antialias=True)  # the whole image to the batch's (h, w): no crop
    images = _normalize(images, dtype, nhwc)
    return images, labels.gpu() if gpu else labels


def _dali_reason(err: Exception) -> str:
    """The informative line of a DALI pipeline error (it also carries the graph's traceback)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    lines = [ln for ln in lines if "pipeline object is no longer valid" not in ln and not ln.startswith("C++")]
    return lines[-1] if lines else type(err).__name__


class _Batches:
    """`steps` batches from `pull()`; `len()` is known up front (the trainer's progress lines use it)."""

    def __init__(self, steps: int, pull):
        self.steps, self.pull = steps, pull

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for i in range(self.steps):
            batch = self.pull(i)
            if batch is not None:
                yield batch


class DaliPipeline(BasePipeline):
    """`data.backend: dali`."""

    def __init__(self, data, dist, run, train: Split, val: Split, roots: dict[str, tuple[Split, Split]]):
        super().__init__(
            data, dist, run, train.classes, num_train=len(train), num_val=len(val), val_excluded=val.excluded
        )
        self.train, self.val, self.roots = train, val, roots
        self.gpu = dist.device.type == "cuda"
        self.dtype = output_dtype(data.dali_dtype, dist.device, amp=run.amp)
        self.nhwc = run.channels_last
        self.threads = max(1, data.workers)
        if not self.gpu and data.dali_hw_decoder_load != 0.99:
            print(
                f"note: data.dali_hw_decoder_load={data.dali_hw_decoder_load} is ignored: DALI decodes on the CPU "
                "here, and only its GPU (mixed) decoder has a hardware decoder to share the work with",
                file=sys.stderr,
            )
        self.skipped: list[tuple[str, str]] = []  # (file, why): undecodable training files skipped
        self._excluded: set[str] = set()
        self._checked: set[str] = set()  # split roots whose headers were checked
        self._train: tuple | None = None  # (phase index, pipeline, files, split)
        self._train_next: tuple[int, int] | None = None  # (epoch, step) the live pipeline delivers next
        self._val: tuple | None = None  # (key, pipeline, batches, per-batch real sample counts)
        self._val_sizes: np.ndarray | None = None
        self._rebuilds = 0

    def _check_split(self, split: Split, is_val: bool) -> None:
        """Header check of a split's files before its first pipeline is built (once per split; evaluate.py reads
        only val/). Each rank reads 1/world of the headers and all ranks share the findings."""
        if str(split.root) in self._checked:
            return
        self._checked.add(str(split.root))
        limit, rank, world = self.data_cfg.max_image_pixels, self.dist.rank, self.dist.world_size
        bad = _gather_problems(check_headers(split.files, limit, self.threads * 2, rank, world), self.dist)
        # One rule for both splits: refuse, or with data.skip_corrupt leave the files out and say so (DALI must
        # never be handed them: in validation a text or GIF file named .JPEG crashes the process).
        if bad and not self.data_cfg.skip_corrupt:
            more = f" (and {len(bad) - 1} more file(s))" if len(bad) > 1 else ""
            raise DataError(f"{bad[0][1]}{more} (set data.skip_corrupt: true to skip such files)")
        what = "validation" if is_val else "training"
        for _, why in bad:
            print(f"warning: skipping {what} file: {why}", file=sys.stderr)
        self.skipped.extend(bad)
        self._excluded.update(f for f, _ in bad)
        if not is_val:
            self.train_skipped += len(bad)
        if is_val and bad:
            self.val_skipped += len(bad)  # left out of the count: the summary and the DAWNBench entry say so
            self.val_excluded += len(bad)
            drop = {f for f, _ in bad}
            keep = [i for i, f in enumerate(split.files) if f not in drop]
            if not keep:
                raise DataError(f"no decodable validation image left in '{split.root}'")
            self.val = dataclasses.replace(
                split, files=[split.files[i] for i in keep], labels=[split.labels[i] for i in keep]
            )
            self.num_val = len(self.val)
            self._checked.add(str(self.val.root))

    # -- pipelines --------------------------------------------------------------------------------------
    def _pipeline(self, graph, batch_size: int, seed: int, **graph_args):
        # Off the training thread: with the pipelined, asynchronous executor DALI reads, decodes and augments on its
        # own threads (and CUDA stream), keeping `dali_prefetch` batches in flight; `pipe.run()` on the training
        # thread only takes a finished batch and schedules the next. Stated here, not left to DALI's defaults.
        pipe = pipeline_def(
            graph,
            batch_size=batch_size,
            num_threads=self.threads,
            device_id=self.dist.device.index if self.gpu else None,
            seed=seed,
            prefetch_queue_depth=self.data_cfg.dali_prefetch,
            exec_pipelined=True,
            exec_async=True,
        )(gpu=self.gpu, dtype=self.dtype, nhwc=self.nhwc, hw_load=self.data_cfg.dali_hw_decoder_load, **graph_args)
        pipe.build()
        return pipe

    def _release(self, which: str) -> None:
        # Dropping the only reference shuts the pipeline down: its threads end and its buffers are freed.
        setattr(self, which, None)

    def _to_torch(self, images, labels, keep: int | None = None):
        """DALI outputs -> (float images NCHW or channels_last, int64 labels), zero-copy via DLPack."""
        if self.gpu:
            with torch.cuda.device(self.dist.device):
                x, y = torch.from_dlpack(images.as_tensor()), torch.from_dlpack(labels.as_tensor())
        else:
            x, y = torch.from_dlpack(images.as_tensor()), torch.from_dlpack(labels.as_tensor())
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)  # an NCHW view with channels_last strides: no copy
        y = y.reshape(-1).long()
        if keep is not None and keep < y.numel():
            x, y = x[:keep], y[:keep]
        return x, y

    # -- training ---------------------------------------------------------------------------------------
    def _phase_order(self, info, split: Split, start_step: int) -> np.ndarray:
        """This rank's sample indices from (info.epoch, start_step) to the end of the phase, full batches only."""
        local = info.phase.batch_size // self.dist.world_size
        phase_end = sum(p.epochs for p in self.run.phases[: info.phase_index + 1])
        per_epoch = [
            np.resize(
                train_shard(len(split), self.dist.rank, self.dist.world_size, e, self.run.seed), info.steps * local
            )
            for e in range(info.epoch, phase_end)
        ]
        return np.concatenate(per_epoch)[start_step * local :]

    def _build_train(self, info, start_step: int) -> None:
        self._release("_train")
        split = self.roots[info.phase.root][0]
        self._check_split(split, is_val=False)
        order = [i for i in self._phase_order(info, split, start_step) if split.files[i] not in self._excluded]
        if not order:
            raise DataError(f"no decodable training image left in '{split.root}'")
        files = [split.files[i] for i in order]
        labels = [split.labels[i] for i in order]
        pipe = self._pipeline(
            _train_graph,
            info.phase.batch_size // self.dist.world_size,
            _seed(self.run.seed, info.epoch, start_step, self.dist.rank, self._rebuilds),
            files=files,
            labels=labels,
            size=info.phase.image_size,
            min_scale=crop_min_area(info.phase),
        )
        self._train = (info.phase_index, pipe, files, split)

    def train_batches(self, info, start_step: int = 0):
        """Exactly `info.steps - start_step` batches of this rank's shard, continuing at `start_step`.

        One pipeline serves the rest of the phase; it is rebuilt only at a phase switch or when the trainer asks
        for a position the live pipeline is not at (a resume).
        """
        if self._train is None or self._train[0] != info.phase_index or self._train_next != (info.epoch, start_step):
            self._release("_val")
            # Built as an uninterrupted run builds it, at the phase's first step with the same seed, then run over
            # the batches before `start_step` without training: DALI's random crops and flips come from one stream
            # per pipeline, so a resume is exact only if it draws the same numbers. On a resume this decodes up to
            # one phase's worth of the rank's shard again (the price of exactness; the torch backend has none).
            first = dataclasses.replace(info, epoch=sum(p.epochs for p in self.run.phases[: info.phase_index]))
            self._build_train(first, 0)
            for step in range((info.epoch - first.epoch) * info.steps + start_step):
                self._next_train(first, step)
        self._train_next = (info.epoch + 1, 0)
        return _Batches(info.steps - start_step, lambda i: self._next_train(info, start_step + i))

    def _next_train(self, info, step: int):
        while True:
            _, pipe, files, split = self._train
            try:
                images, labels = pipe.run()
            except RuntimeError as e:
                self._release("_train")
                bad = self._find_undecodable(e, files, split)
                if not self.data_cfg.skip_corrupt:
                    path, why = bad[0]
                    raise DataError(
                        f"cannot decode '{path}': {why} (set data.skip_corrupt: true to skip such files; "
                        f"`python data/prepare.py --check {split.root.parent}` lists them all)"
                    ) from None
                for path, why in bad:
                    print(f"warning: skipping corrupt file '{path}': {why}", file=sys.stderr)
                self.skipped.extend(bad)
                self._excluded.update(p for p, _ in bad)
                self.train_skipped += len(bad)
                self._rebuilds += 1
                self._build_train(info, step)
                continue
            return self._to_torch(images, labels)

    def _find_undecodable(self, err: Exception, files: list[str], split: Split) -> list[tuple[str, str]]:
        """The files behind a failed DALI batch: those its message names, else a quick scan of the shard."""
        reason = _dali_reason(err)
        known = set(files)
        named = [t.rstrip(".,:;)") for t in re.split(r"[\s'\"]+", str(err))]
        named = list(dict.fromkeys(t for t in named if t in known))
        if named:
            return [(p, quick_problem(p) or reason) for p in named]
        print(f"DALI failed ({reason}): scanning {len(files)} files of '{split.root}' for the culprit", file=sys.stderr)
        with ThreadPoolExecutor(self.threads * 2) as pool:
            problems = list(pool.map(quick_problem, files, chunksize=256))
        bad = [(f, why) for f, why in zip(files, problems, strict=True) if why]
        if not bad:
            raise DataError(
                f"DALI failed to decode a batch of '{split.root}': {reason} (no file looks damaged; "
                f"`python data/prepare.py --check {split.root.parent}` decodes every file)"
            ) from None
        return bad

    # -- validation -------------------------------------------------------------------------------------
    def _build_val(self, phase) -> None:
        size = phase.val_image_size or phase.image_size
        batch = self.data_cfg.val_batch_size
        rank, world = self.dist.rank, self.dist.world_size
        key = (size, phase.rect_val)
        if self._val is not None and self._val[0] == key:
            return
        self._release("_val")
        self._check_split(self.val, is_val=True)
        files, labels = self.val.files, self.val.labels
        if phase.rect_val:
            if self._val_sizes is None:
                self._val_sizes = image_sizes(files, self.threads * 2)
            mine = rank_rect_batches(plan_rect_batches(self._val_sizes, batch, size), rank, world)
            counts = [len(b.indices) for b in mine]
            if not mine:
                self._val = (key, None, 0, counts)
                return
            order = np.concatenate([b.indices for b in mine])
            shapes = [np.tile(np.array([b.height, b.width], np.float32), (batch, 1)) for b in mine]
            pipe = self._pipeline(
                _rect_val_graph,
                batch,
                _seed(self.run.seed, 1),
                files=[files[i] for i in order],
                labels=[labels[i] for i in order],
                shapes=shapes,
            )
            self._val = (key, pipe, len(mine), counts)
            return
        # DALI's shard r is [N*r//W, N*(r+1)//W); pad_last_batch pads every shard to the largest one (rounded up
        # to whole batches) by repeating its last image, and stick_to_shard makes the next epoch start over.
        n = len(files)
        real = n * (rank + 1) // world - n * rank // world
        steps = math.ceil(math.ceil(n / world) / batch)
        counts = [max(0, min(batch, real - i * batch)) for i in range(steps)]
        if real == 0:
            self._val = (key, None, 0, counts)
            return
        shard, shards = rank, world
        if n < world:  # DALI asserts on more shards than files: each rank that has an image reads it alone
            lo = n * rank // world
            files, labels, shard, shards = files[lo : lo + real], labels[lo : lo + real], 0, 1
        pipe = self._pipeline(
            _val_graph,
            batch,
            _seed(self.run.seed, 1),
            files=files,
            labels=labels,
            shard_id=shard,
            num_shards=shards,
            size=size,
            resize_to=int(round(size / self.data_cfg.val_crop_ratio)),
        )
        self._val = (key, pipe, steps, counts)

    def val_batches(self, phase):
        """This rank's share of the validation set, every image exactly once over all ranks, padding removed."""
        self._build_val(phase)
        _, pipe, steps, counts = self._val

        def pull(i: int):
            try:
                images, labels = pipe.run()
            except RuntimeError as e:
                self._release("_val")
                bad = self._find_undecodable(e, self.val.files, self.val)
                path, why = bad[0]
                raise DataError(f"cannot decode validation image '{path}': {why}") from None
            return self._to_torch(images, labels, counts[i]) if counts[i] else None

        return _Batches(steps, pull)

    def close(self) -> None:
        self._release("_train")
        self._release("_val")
