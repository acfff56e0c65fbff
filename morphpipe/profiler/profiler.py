"""The Profiler: measures every phase this machine has on a real workload and returns a Profile."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch
from tqdm import tqdm

from morphpipe.data.feature_store import FeatureStoreCounters
from morphpipe.data.fingerprint import dataset_fingerprint
from morphpipe.numeric import format_bytes
from morphpipe.nn.task import NodeClassification, Task
from morphpipe.nn.train_step import PRECISIONS
from morphpipe.profiler.cache_ranking import rank_cache_by_workload
from morphpipe.profiler.ceiling import BF16_FLAGS, best_seconds, isa_flags
from morphpipe.profiler.contention import ContentionMonitor
from morphpipe.profiler.disk import cache_budget, measure_disk_profile, resident_bytes
from morphpipe.profiler.hardware import HardwareFacts
from morphpipe.profiler.operators import MIN_TIMED_STEPS, OPERATORS, ProfilingSession
from morphpipe.profiler.profile import PhaseTiming, Profile
from morphpipe.profiler.resident import PeakResident
from morphpipe.sampling.validation import check_fanouts, check_positive

DEVICES = ("auto", "cuda", "cpu")
# The batch buffer a plan holds by default (`train --gbs`, `plan_from_profile`'s gbs), whose batches count against
# the memory budget with features on disk.
BUFFER_BATCHES = 10
# How often a training step's resident memory is sampled while its peak is measured (a step takes 0.1-2 s).
STEP_MEMORY_INTERVAL_S = 0.005
# The least share of a timed GPU batch left to the GPU once the store's reads are taken out (route_1_reads_apart).
MIN_GPU_SHARE = 0.05


def route_1_reads_apart(timing: PhaseTiming, reads: FeatureStoreCounters,
                        batches: int) -> tuple[PhaseTiming, float, str | None]:
    """GPU batching timed while its `batches` batches (warm-up ones included) gathered rows through the feature store
    (`reads`, its counters over them): the timing less each batch's share of the store's read time (the disk's, a
    resource of its own in the plan), and the rows a batch gathered through the store. The read time per batch is
    the mean over every batch, the timing's over the timed ones: where the warm-up's colder reads make it exceed
    what a timed batch took, the GPU's part is kept at MIN_GPU_SHARE of it, with a line that says so."""
    if batches < 1:
        raise ValueError(f"route_1_reads_apart needs the batches made, >= 1, got {batches!r}")
    read_s = reads.read_seconds / batches
    gpu_s = timing.mean_s - read_s
    note = None
    if gpu_s < timing.mean_s * MIN_GPU_SHARE:
        note = (f"profiling: the store's reads took {read_s * 1e3:.3g} ms per GPU batch, the timed batches "
                f"{timing.mean_s * 1e3:.3g} ms in all: UVA batching kept at {MIN_GPU_SHARE:.0%} of it")
        gpu_s = timing.mean_s * MIN_GPU_SHARE
    return timing.scaled(gpu_s / timing.mean_s), (reads.hits + reads.misses) / batches, note


def default_thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to the core count, and the core count itself: enough to fit T(P)."""
    counts = {cores}
    power = 1
    while power < cores:
        counts.add(power)
        power *= 2
    return sorted(counts)


def resolve_device(device: str) -> str:
    """'auto' becomes 'cuda' when a CUDA device is visible, else 'cpu'; 'cuda' without one is an error."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r}: choose one of {DEVICES}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device; use --device cpu (or auto)")
    return device


class Profiler:
    """Times CPU batching, GPU batching, DMA and training for one workload (MorphGL, Table III).

    `thread_counts` are the CPU thread counts measured (default: powers of two up to the
    usable cores); each measurement is `warmup` untimed steps and up to `steps` timed ones,
    stopping after `budget_s` seconds once a few steps are timed. A `monitor` watches the
    machine meanwhile: when other processes took our cores, the whole measurement is repeated
    (up to `attempts` times) and the least contended one is kept; the profile records it.
    `task` (default: node classification) says what is batched and trained, and `precision` (float32, bf16, or
    auto: the faster of the two where the hardware has bfloat16 arithmetic) the arithmetic of the timed training
    steps, so that a plan is made for the step training will run; the profile's workload records it.

    With features on disk (the graph has a feature store) the disk is profiled too (profiler/disk.py): its
    read rate at the store's queue depth, and the hit ratio of a host cache of hot rows up to what
    `memory_budget` (bytes; default: a share of the memory available now) leaves beside the topology and what
    training holds (`working_bytes`: the batches a plan's buffer of `buffer_batches` holds, and a step's peak), with the
    preads a missed row costs at each cache size, and the read rate the store achieved while it gathered the
    sampled batches (its own read timer). CPU batching is then timed on those same batches with every row they
    gather cached, so its time is the CPU's alone and the disk, a resource of its own, is counted once; the
    store's counters during that timing are kept in `timed_batching_reads` (no reads: nothing of the disk's in
    the CPU time). GPU batching reads the rows its GPU cache lacks through the store as well: its timing keeps the
    GPU's part (`route_1_reads_apart`) and the disk profile the rows a Route-1 batch gathers, so that both routes'
    misses hold the one disk in the plan, at the planned cache's hit ratio. A typed graph's stores (one per featured
    node type) are profiled as one, their rows every featured type's and their cache the one the types share.
    """

    def __init__(
        self,
        graph,
        *,
        model: str = "sage",
        fanouts: Sequence[int] = (15, 10, 5),
        batch_size: int = 1024,
        hidden: int | None = None,
        device: str = "auto",
        thread_counts: Sequence[int] | None = None,
        warmup: int = 2,
        steps: int = 8,
        budget_s: float = 5.0,
        seed: int = 0,
        progress: bool = True,
        attempts: int = 2,
        monitor: ContentionMonitor | None = None,
        log: Callable[[str], None] = print,
        task: Task | None = None,
        memory_budget: int | None = None,
        disk_seconds: float = 1.0,
        precision: str = "float32",
        buffer_batches: int = BUFFER_BATCHES,
    ) -> None:
        self.task = task or NodeClassification()
        self.task.check_graph(graph)
        self.graph = graph
        self.model = model
        self.fanouts = check_fanouts(fanouts)
        self.batch_size = check_positive("batch_size", batch_size)
        self.hidden = hidden
        self.device = resolve_device(device)
        self.hardware = HardwareFacts.detect()
        counts = default_thread_counts(self.hardware.usable_cores) if thread_counts is None else list(thread_counts)
        self.thread_counts = sorted({check_positive("thread_counts", count) for count in counts})
        self.warmup = check_positive("warmup", warmup) if warmup else 0
        self.steps = check_positive("steps", steps)
        if not budget_s > 0:
            raise ValueError(f"budget_s={budget_s!r}: give the seconds one measurement may take, > 0")
        self.budget_s = float(budget_s)
        self.seed = seed
        self.progress = progress
        self.attempts = check_positive("attempts", attempts)
        self.monitor = monitor or ContentionMonitor()
        self.log = log
        self.memory_budget = memory_budget
        self.disk_seconds = disk_seconds
        self.buffer_batches = check_positive("buffer_batches", buffer_batches)
        if precision not in (*PRECISIONS, "auto"):
            raise ValueError(f"precision={precision!r}: choose one of {(*PRECISIONS, 'auto')}")
        self.precision = precision
        self.timed_batching_reads: FeatureStoreCounters | None = None

    def phases(self) -> list[tuple[str, str]]:
        """The (phase, hardware) operators this profile needs, in the order they run."""
        if self.device == "cpu":
            return [("cpu_batching", "cpu"), ("training", "cpu")]
        needed = [("cpu_batching", "cpu"), ("gpu_batching", "cuda"), ("dma", "cuda"), ("training", "cuda")]
        missing = [phase for phase in needed if phase not in OPERATORS]
        if missing:
            raise ValueError(
                f"device='cuda': no operator measures {', '.join(f'{p} on {h}' for p, h in missing)} in this "
                "build (morphpipe.profiler.operators registers them); profile with --device cpu"
            )
        return needed

    def run(self) -> Profile:
        """Measures every phase (again when the machine was busy) and returns the least contended Profile."""
        best: Profile | None = None
        for attempt in range(1, self.attempts + 1):
            self.monitor.start()
            profile = self.measure()
            contention = self.monitor.stop()
            profile = profile.replaced(contention=contention.to_dict())
            if best is None or contention.other_cores < best.contention["other_cores"]:
                best = profile
            if not contention.busy:
                break
            again = "measuring again" if attempt < self.attempts else "keeping the least contended measurement"
            self.log(f"profiling: {contention.describe()}; {again}")
        assert best is not None
        if best.taken_on_busy_machine:
            self.log("profiling: this profile was taken on a busy machine (recorded in it); plans made from it fit "
                     "that load, and re-planning while training (`train --replan epoch`) corrects them later")
        return best

    def measure(self) -> Profile:
        """Measures every phase once and returns the Profile."""
        phases = self.phases()
        per_measurement = self.warmup + self.steps
        # the cache the disk is measured behind ranks by the workload
        rank_cache_by_workload(self.graph, self.task, self.fanouts, self.batch_size, progress=self.progress)
        store = getattr(self.graph, "feature_store", None)
        # A typed graph's stores are seen as one (TypedFeatureStore): its rows are the featured types' rows, its
        # hotness the shared cache's order; a homogeneous graph's rows are its nodes, hot by in-degree.
        typed = store is not None and getattr(self.graph, "is_hetero", False)
        # With features on disk, also the batches a timed CPU batcher builds ahead of the last one it delivers (its
        # window holds 2 per thread), so that every row the timing gathers is among those cached.
        ahead = 2 * max(self.thread_counts) if store is not None else 0
        total = sum(per_measurement * (len(self.thread_counts) if hw == "cpu" else 1) for _, hw in phases)
        with tqdm(total=total + per_measurement + ahead, desc="profiling", unit="step",
                  disable=not self.progress) as bar:
            session = ProfilingSession(
                graph=self.graph, fanouts=self.fanouts, batch_size=self.batch_size, model_name=self.model,
                hidden=self.hidden, thread_counts=self.thread_counts, warmup=self.warmup, steps=self.steps,
                budget_s=self.budget_s, seed=self.seed, progress=bar, task=self.task,
                precision="float32" if self.precision == "auto" else self.precision,
            )
            bar.set_postfix_str("sampling batches")
            if store is not None:
                store.reset_counters()
            gathered = []
            with self.task.batcher(self.graph, self.fanouts, self.batch_size, route=0, seed=self.seed,
                                   pin_memory=False) as batcher:
                # The batches the CPU batching operator times, epoch after epoch as it runs them (a small graph's
                # epoch may hold fewer).
                batches = itertools.chain.from_iterable(batcher.epoch(epoch) for epoch in itertools.count())
                for batch in itertools.islice(batches, per_measurement + ahead):
                    if len(session.sample_batches) < per_measurement:
                        session.sample_batches.append(batch)
                    gathered.append(batch.input_nodes if not typed else store.rows_of(batch.input_nodes))
                    bar.update(1)
            sampled_reads = store.counters() if store is not None else None
            chosen_because = None
            if self.precision == "auto":
                bar.set_postfix_str("choosing the precision")
                session.precision, chosen_because = self.faster_precision(session)
            timings = {}
            gpu_rows = None
            for phase, hardware in phases:
                bar.set_postfix_str(f"{phase} on {hardware}")
                if store is not None and phase == "gpu_batching":
                    store.reset_counters()
                with self.rows_cached(gathered if phase == "cpu_batching" else []):
                    timings[phase] = OPERATORS[(phase, hardware)](session)
                if store is not None and phase == "gpu_batching":  # Route 1 read through the store: take it apart
                    timings[phase], gpu_rows, note = route_1_reads_apart(
                        timings[phase], store.counters(), session.warmup + timings[phase].samples)
                    if note is not None:
                        self.log(note)
            batch_bytes = int(sum(b.nbytes for b in session.sample_batches) / len(session.sample_batches))
            disk = None
            if store is not None:
                bar.set_postfix_str("training's memory")
                working = self.working_bytes(session, batch_bytes)
                bar.set_postfix_str("disk reads")
                hotness = store.hotness() if typed else self.graph.cache_hotness()
                disk = replace(measure_disk_profile(store, gathered, hotness,
                                                    cache_budget(self.graph, self.memory_budget, working),
                                                    self.disk_seconds, resident_bytes(self.graph) + working,
                                                    sampled_reads), gpu_rows_per_batch=gpu_rows)
        if chosen_because is not None:
            self.log(chosen_because)  # once the progress bar is gone, not through it
        if disk is not None:
            needed = disk.resident_bytes
            over = (f"; the memory budget ({format_bytes(self.memory_budget)}) is below the "
                    f"{format_bytes(needed)} they need together, so the run will hold more than it (raise "
                    "--memory-budget, or lower --gbs or --batch-size)"
                    if self.memory_budget is not None and self.memory_budget < needed else "")
            self.log(f"profiling: training holds {format_bytes(working)} in RAM beside the graph's "
                     f"{format_bytes(needed - working)} (batches in flight and a step's peak): a feature "
                     f"cache may take {format_bytes(disk.cache_budget_bytes)} of the memory budget{over}")
        num_seeds = len(self.task.seeds(self.graph))
        return Profile(
            hardware=self.hardware,
            device=self.device,
            num_batches=math.ceil(num_seeds / self.batch_size),
            batch_bytes=batch_bytes,
            cpu_batching=timings["cpu_batching"],
            gpu_batching=timings.get("gpu_batching"),
            dma=timings.get("dma"),
            training=timings["training"] if self.device == "cuda" else None,
            cpu_training=timings["training"] if self.device == "cpu" else None,
            workload=self.workload(session.precision),
            disk=disk,
        )

    def faster_precision(self, session: ProfilingSession) -> tuple[str, str]:
        """For `precision="auto"`: bf16 when the training hardware has bfloat16 arithmetic and a bf16 step on the
        sampled batches times faster than a float32 one, else float32; and a line saying which and why."""
        device = torch.device("cuda" if self.device == "cuda" else "cpu")
        if device.type == "cpu":
            present = [flag for flag in isa_flags() if flag in BF16_FLAGS]
            if not present:
                return "float32", "precision float32 (auto: this CPU reports no AVX512-BF16 or AMX)"
            hardware = " ".join(present)
        elif not torch.cuda.is_bf16_supported():
            return "float32", "precision float32 (auto: this GPU has no bfloat16 arithmetic)"
        else:
            hardware = torch.cuda.get_device_name(device)
        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        seconds = {}
        for precision in PRECISIONS:
            step = session.new_train_step(device, precision)
            batches = session.cycled_batches()

            def timed_step() -> None:
                step(next(batches).to(device))
                synchronize()

            seconds[precision] = best_seconds(timed_step, MIN_TIMED_STEPS)
        chosen = min(PRECISIONS, key=lambda precision: seconds[precision])
        return chosen, (f"precision {chosen} (auto: {hardware}; a training step takes "
                        + ", ".join(f"{seconds[p] * 1e3:.0f} ms in {p}" for p in PRECISIONS) + ")")

    def working_bytes(self, session: ProfilingSession, batch_bytes: int) -> int:
        """Host RAM training takes beside the graph and the feature cache, which the memory budget must hold too:
        the batches in flight (a plan's buffer of `buffer_batches`, one in training, one being built) of
        `batch_bytes` each (the sampled batches' mean size), and the peak a CPU training step adds (its activations,
        gradients and optimizer state, sampled over two steps of the model training will build)."""
        step_bytes = 0
        if self.device == "cpu":
            step = session.new_train_step(torch.device("cpu"))
            batches = session.cycled_batches()
            with PeakResident(interval_s=STEP_MEMORY_INTERVAL_S) as peak:
                for _ in range(2):
                    step(next(batches))
            step_bytes = peak.growth("anon")
        return batch_bytes * (self.buffer_batches + 2) + step_bytes

    @contextmanager
    def rows_cached(self, gathered: list[torch.Tensor]) -> Iterator[None]:
        """While CPU batching is timed with features on disk: a feature store caching every row of `gathered` (the
        batches the timing builds, sampled first), so the time is the CPU's; the disk's is measured apart. Its
        counters afterwards are `timed_batching_reads`. Nothing changes when `gathered` is empty."""
        store = getattr(self.graph, "feature_store", None)
        if store is None or not gathered:
            yield
            return
        cached = store.twin(cached_rows=torch.unique(torch.cat(gathered)))
        self.graph.feature_store = cached
        try:
            yield
        finally:
            self.graph.feature_store = store
        self.timed_batching_reads = counted = cached.counters()
        if counted.reads:
            self.log(f"profiling: {counted.misses:,} of the {counted.hits + counted.misses:,} rows the timed CPU "
                     f"batches gathered were not among the sampled batches' rows; their {counted.reads:,} reads "
                     f"({counted.read_seconds:.3f} s) are in the CPU batching time as well as in the disk's")

    def workload(self, precision: str) -> dict[str, str | int | float | bool | None]:
        """What was profiled (in `precision`, the one `auto` settled on), stored in the Profile so a plan can say what
        it is for."""
        return {
            **self.task.meta(),
            "dataset": getattr(self.graph, "name", "graph"),
            "dataset_fingerprint": dataset_fingerprint(self.graph),
            "num_nodes": int(self.graph.num_nodes),
            "num_edges": int(self.graph.num_edges),
            "model": self.model,
            "hidden": self.hidden,
            "fanouts": ",".join(str(f) for f in self.fanouts),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "precision": precision,
        }
