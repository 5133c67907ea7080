"""A parallel layout: how a training job is split over the GPUs of a System.

Rank order follows Megatron-LM: tensor-parallel (TP) ranks are adjacent (inside a node), then
data-parallel (DP), then pipeline stages (PP):

    rank = pp_index · (dp · tp) + dp_index · tp + tp_index

Expert parallelism (EP) splits the DP ranks into groups of `ep` that share the experts.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace

from kit.errors import KitError

SCHEDULES = ("1f1b", "gpipe", "interleaved")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("fp16", "bf16", "fp32")
# The gradients' dtype when none is given: Megatron-LM keeps and all-reduces bf16 models'
# gradients in fp32 (it forces accumulate_allreduce_grads_in_fp32 for bf16; its distributed-
# optimizer docs count 18 B per parameter for "bf16 param, fp32 grads" against 20 for fp16 and
# 16 for fp32), DeepSpeed's bf16 optimizer accumulates them in fp32 too; fp16 models keep fp16
# gradients (with loss scaling), as the ZeRO paper counts them.
DEFAULT_GRAD_DTYPE = {"fp16": "fp16", "bf16": "fp32", "fp32": "fp32"}
BUCKET_PARAMS = 40e6  # Megatron's default gradient bucket: 40M parameters


# micro-batches per replica the event simulator will take (each adds events on every rank; a
# million took about 10 s and gigabytes): Megatron runs use tens to a few thousand
MAX_MICRO_BATCHES = 65536
# passes the simulator runs per phase: micro-batches x model chunks on every pipeline stage
# (one representative rank a stage). The micro-batch cap alone let --pp 64 take 65,536 of them,
# 4.2 million passes: --pp 32 with 16,384 (524,288 passes, 8.3 million ops) had taken 152 s and
# 3.6 GB, so that one would have run for about 20 minutes and 29 GB before printing anything
MAX_STAGE_PASSES = 1 << 19


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    micro_batch: int = 1
    global_batch: int | None = None  # default: micro_batch · dp (one micro-batch per replica)
    virtual_stages: int = 1  # model chunks per pipeline stage (interleaved 1F1B when > 1)
    schedule: str = "1f1b"
    zero: int = 0  # 0: plain DP; 1, 2, 3: ZeRO stage (3 = FSDP)
    recompute: str = "none"
    sequence_parallel: bool = False
    dtype: str = "fp16"
    grad_dtype: str | None = None  # None: DEFAULT_GRAD_DTYPE[dtype]
    overlap_grad_reduce: bool = True  # bucketed all-reduce during the last backward
    bucket_bytes: float | None = None  # gradient bytes a bucket; None: Megatron's 40M parameters
    optimizer_step: bool = True  # False: forward + backward (+ gradient sync) only
    # whether grad_dtype and bucket_bytes were left to their defaults (with_ re-derives them)
    grad_dtype_defaulted: bool = field(default=False, init=False, repr=False, compare=False)
    bucket_defaulted: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "ep", "micro_batch", "virtual_stages", "global_batch", "zero"):
            v = getattr(self, name)  # numpy integers are whole numbers too
            if isinstance(v, numbers.Integral) and not isinstance(v, (bool, int)):
                object.__setattr__(self, name, int(v))
        for name in ("dp", "tp", "pp", "ep", "micro_batch", "virtual_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise KitError(f"--{name.replace('_', '-')} must be a positive whole number, got {v!r}")
        if self.global_batch is not None and (not isinstance(self.global_batch, int)
                                              or isinstance(self.global_batch, bool) or self.global_batch < 1):
            raise KitError(f"--global-batch must be a positive whole number, got {self.global_batch!r}")
        if self.global_batch is not None and self.global_batch % (self.micro_batch * self.dp):
            raise KitError(f"--global-batch {self.global_batch} must be a multiple of "
                           f"micro-batch x dp = {self.micro_batch} x {self.dp}")
        if self.micro_batches > MAX_MICRO_BATCHES:
            raise KitError(f"--global-batch {self.global_batch} gives {self.micro_batches:,} micro-batches "
                           f"per replica (global batch / (micro-batch x dp)); the simulator takes at "
                           f"most {MAX_MICRO_BATCHES:,}: raise --micro-batch or --dp")
        passes = self.micro_batches * self.virtual_stages * self.pp
        if passes > MAX_STAGE_PASSES:
            raise KitError(f"{self.micro_batches:,} micro-batches per replica x "
                           + (f"{self.virtual_stages} virtual stages x " if self.virtual_stages > 1 else "")
                           + f"--pp {self.pp} = {passes:,} pipeline passes to simulate, more than "
                           f"the {MAX_STAGE_PASSES:,} the simulator takes; "
                           + ("lower --pp or --virtual-stages (each stage and chunk is at least one "
                              "layer)" if self.virtual_stages * self.pp > MAX_STAGE_PASSES
                              else "lower --global-batch or raise --micro-batch or --dp"))
        if self.schedule not in SCHEDULES:
            raise KitError(f"schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        if self.virtual_stages > 1 and self.schedule == "gpipe":
            raise KitError(f"virtual stages {self.virtual_stages} need the interleaved 1F1B schedule, "
                           "not gpipe")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            object.__setattr__(self, "schedule", "interleaved")
        if self.schedule == "interleaved" and self.virtual_stages == 1:
            # one chunk a stage is 1F1B's timing with more micro-batches held in flight: refused,
            # not reported as interleaved
            raise KitError("the interleaved 1F1B schedule needs --virtual-stages N >= 2 (model chunks "
                           "per pipeline stage); with one chunk a stage it is plain 1f1b")
        if self.schedule == "interleaved" and self.pp == 1:
            raise KitError("interleaved pipeline (--virtual-stages > 1) needs --pp > 1")
        if isinstance(self.zero, bool) or not isinstance(self.zero, int) or self.zero not in (0, 1, 2, 3):
            raise KitError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.zero >= 2 and self.pp > 1:
            # DeepSpeed's PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
            # parallelism" (runtime/pipe/engine.py) and Megatron-LM's distributed optimizer shards
            # the optimizer state only (ZeRO-1). The kit prices ZeRO-2/3 as DeepSpeed's
            # data-parallel engine and FSDP without no_sync run them (a reduce-scatter after every
            # backward pass, ZeRO-3 an all-gather before every pass), which no pipeline engine
            # does; it had predicted them at --pp > 1 without a word
            raise KitError(f"--zero {self.zero} with --pp {self.pp}: ZeRO stages 2 and 3 shard the "
                           "gradients, which DeepSpeed's pipeline engine refuses (\"ZeRO-2 and ZeRO-3 "
                           "are incompatible with pipeline parallelism\") and Megatron-LM's "
                           "distributed optimizer does not do (it is ZeRO-1); use --zero 1 or --pp 1")
        if self.recompute not in RECOMPUTE:
            raise KitError(f"--recompute {self.recompute!r}: choose one of {', '.join(RECOMPUTE)}")
        if self.dtype not in DTYPES:
            raise KitError(f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.grad_dtype is None:
            object.__setattr__(self, "grad_dtype", DEFAULT_GRAD_DTYPE[self.dtype])
            object.__setattr__(self, "grad_dtype_defaulted", True)
        if self.grad_dtype not in DTYPES:
            raise KitError(f"--grad-dtype {self.grad_dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.dtype == "fp32" and self.grad_dtype != "fp32":
            raise KitError(f"--grad-dtype {self.grad_dtype} with --dtype fp32: fp32 weights take "
                           "fp32 gradients")
        for name in ("sequence_parallel", "overlap_grad_reduce", "optimizer_step"):
            if not isinstance(getattr(self, name), bool):  # "no" would be taken as True
                raise KitError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.bucket_bytes is None:  # Megatron's bucket is a parameter count, whatever the dtype
            object.__setattr__(self, "bucket_bytes", BUCKET_PARAMS * self.grad_bytes)
            object.__setattr__(self, "bucket_defaulted", True)
        b = self.bucket_bytes
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < float("inf"):
            raise KitError(f"bucket_bytes must be a positive finite number of bytes, got {b!r}")
        if self.dp % self.ep:
            raise KitError(f"--ep {self.ep} must divide --dp {self.dp} (experts are sharded over "
                           "data-parallel ranks)")
        if self.sequence_parallel and self.tp == 1:  # it had been switched off without a word
            raise KitError("--sequence-parallel (sequence_parallel) splits the norms and dropout "
                           "over --tp; with tp 1 it changes nothing: raise --tp or drop it")

    @property
    def weight_bytes(self) -> int:
        """Bytes of one weight as the model computes with it (what ZeRO-3 all-gathers)."""
        return 4 if self.dtype == "fp32" else 2

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient as it is kept and reduced over the data-parallel ranks."""
        return 4 if self.grad_dtype == "fp32" else 2

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.micro_batch * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per replica per iteration."""
        return self.batch // (self.micro_batch * self.dp)

    def rank(self, pp_i: int, dp_i: int, tp_i: int) -> int:
        return pp_i * self.dp * self.tp + dp_i * self.tp + tp_i

    def tp_group(self, pp_i: int = 0, dp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, dp_i, t) for t in range(self.tp)]

    def dp_group(self, pp_i: int = 0, tp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, d, tp_i) for d in range(self.dp)]

    def ep_group(self, pp_i: int = 0, tp_i: int = 0, dp_i: int = 0) -> list[int]:
        """The expert-parallel group of DP rank dp_i: the run of ep consecutive DP ranks holding it."""
        start = dp_i - dp_i % self.ep
        return [self.rank(pp_i, d, tp_i) for d in range(start, start + self.ep)]

    def edp_group(self, pp_i: int = 0, tp_i: int = 0, dp_i: int = 0) -> list[int]:
        """The expert-data-parallel group of DP rank dp_i: the dp / ep ranks that hold the same
        experts (one from each EP group), over which those experts' gradients are reduced."""
        return [self.rank(pp_i, d, tp_i) for d in range(dp_i % self.ep, self.dp, self.ep)]

    def pp_pair(self, pp_i: int) -> list[int]:
        """Ranks of stage pp_i and pp_i + 1 at dp 0, tp 0 (a point-to-point link)."""
        return [self.rank(pp_i, 0, 0), self.rank(pp_i + 1, 0, 0)]

    def stage_of(self, rank: int) -> int:
        """The pipeline stage a rank belongs to (the inverse of rank()'s pp_i)."""
        return stage_of(rank, self.dp, self.tp)

    def stage_ranks(self, pp_i: int) -> list[int]:
        return list(range(pp_i * self.dp * self.tp, (pp_i + 1) * self.dp * self.tp))

    def check_system(self, system) -> None:
        if self.world_size > system.world_size:
            raise KitError(f"layout dp {self.dp} x tp {self.tp} x pp {self.pp} = {self.world_size} "
                           f"GPUs, but {system.key} has {system.world_size}; add --nodes")

    def with_(self, **kw) -> "Layout":
        """This layout with the fields in kw changed. A gradient dtype (and bucket size) left to
        its default follows a new dtype: Layout().with_(dtype="bf16") had kept the fp16 model's
        fp16 gradients (Megatron keeps a bf16 model's in fp32), and with_(dtype="fp32") had been
        refused for "--grad-dtype fp16", which nobody had asked for. The default bucket is 40M
        gradients in whatever dtype they end up in."""
        if self.grad_dtype_defaulted and "grad_dtype" not in kw:
            kw["grad_dtype"] = None
        if self.bucket_defaulted and "bucket_bytes" not in kw:
            kw["bucket_bytes"] = None
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep,
                "micro_batch": self.micro_batch, "global_batch": self.batch,
                "micro_batches": self.micro_batches, "virtual_stages": self.virtual_stages,
                "schedule": self.schedule, "zero": self.zero, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "dtype": self.dtype,
                "grad_dtype": self.grad_dtype, "world_size": self.world_size, "optimizer_step": self.optimizer_step}


def stage_of(rank: int, dp: int, tp: int) -> int:
    """The pipeline stage of a rank in a dp x tp x pp layout (ranks are stage-major)."""
    return int(rank) // (dp * tp)
