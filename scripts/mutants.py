"""The mutants `scripts/mutation_check.py` applies: one small deliberate bug each, and the tests that must catch it.

Each entry: `name`; `file` (repository-relative); `find`, an exact source text that must occur
exactly once in that file (else the mutant is reported "stale": re-anchor it); `replace`, what
it becomes; `tests`, the pytest arguments (node ids or files) that must fail on it; `ci`, True
for the fixed subset the test suite runs every time (tests/test_mutation_check.py). Mutants of
files under csrc/ need a native rebuild (~60 s each) and run only with `--all`.
"""
from __future__ import annotations

TRACE = "tests/executor/test_vs_simulator_trace.py"
GUARDS = "tests/executor/test_guards_and_bookkeeping.py"
RANDOM = "tests/sampling/test_epoch_randomness.py"
WIDE = "tests/ops/test_wide_and_params.py"
NN = "tests/nn/test_layer_params.py"

MUTANTS: list[dict] = [
    # --- executor ------------------------------------------------------------------------------------
    dict(name="executor-flush-trains-before-transfer", file="morphpipe/executor/executor.py",
         find="""            if overlap:
                overlap -= 1
                self.gpu_buffer.append(self.transfer(self.cpu.get()))
                self.trace.level("gpu", len(self.gpu_buffer))
            self.train(item)
""",
         replace="""            self.train(item)
            if overlap:
                overlap -= 1
                self.gpu_buffer.append(self.transfer(self.cpu.get()))
                self.trace.level("gpu", len(self.gpu_buffer))
""",
         tests=[f"{TRACE}::test_training_order_and_buffers_match_the_simulator_exactly"], ci=True),
    dict(name="executor-flushes-before-filling", file="morphpipe/executor/executor.py",
         find="""            elif self.gpu_has_room():
                self.gpu_batch()  # filling, or blocking on a full CPU buffer: take a GPU batch
            elif self.cpu_full():
                self.flush()  # flushing: both buffers full
""",
         replace="""            elif self.gpu_buffer and self.cpu_full():
                self.flush()  # flushing: both buffers full
            elif self.gpu_has_room():
                self.gpu_batch()  # filling, or blocking on a full CPU buffer: take a GPU batch
""",
         tests=[f"{TRACE}::test_training_order_and_buffers_match_the_simulator_exactly"], ci=False),
    dict(name="executor-blocking-trains-newest", file="morphpipe/executor/executor.py",
         find="self.train(self.gpu_buffer.popleft())  # blocking",
         replace="self.train(self.gpu_buffer.pop())  # blocking",
         tests=[TRACE], ci=False),
    dict(name="executor-flush-overlaps-one-batch", file="morphpipe/executor/executor.py",
         find="overlap = min(self.cpu.ready(), self.split.cbs) if self.cpu is not None else 0",
         replace="overlap = min(self.cpu.ready(), 1) if self.cpu is not None else 0",
         tests=[TRACE], ci=False),
    dict(name="executor-no-exactly-once-check", file="morphpipe/executor/executor.py",
         find="""            self.devices.finish_epoch()
            loop.check_complete()
""",
         replace="""            self.devices.finish_epoch()
""",
         tests=[f"{GUARDS}::test_check_complete_fires_when_a_position_is_trained_twice",
                f"{GUARDS}::test_check_complete_fires_when_the_gpu_batcher_yields_more_than_the_plan"], ci=True),
    dict(name="executor-epoch-loss-unweighted", file="morphpipe/executor/executor.py",
         find="loss = float((losses[trained] * weights[trained]).sum() / max(float(weights[trained].sum()), 1.0))",
         replace="loss = float(losses[trained].mean()) if self.losses else 0.0",
         tests=[f"{GUARDS}::test_epoch_loss_is_the_mean_over_seeds"], ci=True),
    dict(name="cpu-buffer-no-extra-batch-check", file="morphpipe/executor/cpu_buffer.py",
         find="""        self.finished_at = self._trace.now()
        if next(self._batches, None) is not None:""",
         replace="""        self.finished_at = self._trace.now()
        if next(self._batches, None) is not None and False:""",
         tests=[f"{GUARDS}::test_the_cpu_buffer_fires_when_the_cpu_batcher_yields_more_than_the_plan"], ci=False),
    dict(name="trace-overlap-check-compares-starts", file="morphpipe/executor/trace.py",
         find="if after.start < before.end - tolerance_s:",
         replace="if after.start < before.start - tolerance_s:",
         tests=[f"{GUARDS}::test_overlap_check_fires_on_one_lane_only"], ci=True),
    dict(name="accuracy-mean-of-batch-accuracies", file="morphpipe/executor/evaluate.py",
         find="correct += int((logits.argmax(dim=1) == batch.y).sum())",
         replace="correct += float((logits.argmax(dim=1) == batch.y).float().mean()) * seeds.numel() / len(batcher)",
         tests=[f"{GUARDS}::test_accuracy_is_correct_seeds_over_all_seeds"], ci=False),
    # --- sampling ------------------------------------------------------------------------------------
    dict(name="cpu-batcher-same-neighbourhoods-every-epoch", file="morphpipe/sampling/cpu_batcher.py",
         find="self.batch_size, self.drop_last, epoch_seed(self.seed, epoch))",
         replace="self.batch_size, self.drop_last, epoch_seed(self.seed, 0))",
         tests=[RANDOM], ci=True),
    dict(name="serial-batcher-same-neighbourhoods-every-epoch", file="morphpipe/sampling/serial_batcher.py",
         find="seed=epoch_seed(sampling_seed, index)",
         replace="seed=epoch_seed(self.seed, index)",
         tests=[RANDOM], ci=False),
    dict(name="epoch-seed-ignores-run-seed", file="morphpipe/sampling/epochs.py",
         find="return (int(seed) * 1_000_003 + int(epoch)) % (2**63)",
         replace="return int(epoch) % (2**63)",
         tests=[RANDOM], ci=False),
    # --- scheduler (simulators) -------------------------------------------------------------------------
    dict(name="simulator-flush-overlaps-one-batch", file="morphpipe/scheduler/model.py",
         find="overlap = min(len(self.cpu_buffer.items), self.split.cbs)",
         replace="overlap = min(len(self.cpu_buffer.items), 1)",
         tests=[TRACE], ci=False),
    dict(name="fast-simulator-flush-overlaps-one-batch", file="morphpipe/scheduler/fastsim.py",
         find="overlap = min(len(self.cpu.buffer), self.split.cbs)",
         replace="overlap = min(len(self.cpu.buffer), 1)",
         tests=["tests/scheduler/test_engines.py"], ci=False),
    # --- partitioner -------------------------------------------------------------------------------------
    dict(name="lower-bound-drops-the-gpu-term", file="morphpipe/partitioner/bounds.py",
         find="return max(n_cpu * t_cb, n_cpu * t_dma + n_gpu * t_gb, n_gpu * t_gb + n * t_m)",
         replace="return max(n_cpu * t_cb, n_cpu * t_dma + n_gpu * t_gb)",
         tests=["tests/partitioner/test_partitioner.py::test_lower_bound_by_hand"], ci=False),
    dict(name="eq6-drops-training", file="morphpipe/partitioner/bounds.py",
         find="max(t_dma / (1 + x), t_m, (t_cb - x * t_uva) / (1 + x))",
         replace="max(t_dma / (1 + x), (t_cb - x * t_uva) / (1 + x))",
         tests=["tests/partitioner/test_partitioner.py::test_eq6_by_hand", "tests/partitioner/test_bounds_by_hand.py"],
         ci=False),
    dict(name="buffer-sizes-ratio-inverted", file="morphpipe/partitioner/partitioner.py",
         find="math.floor(gbs * n_cpu / n_gpu + 0.5)",
         replace="math.floor(gbs * n_gpu / n_cpu + 0.5)",
         tests=["tests/partitioner/test_partitioner.py::test_buffer_sizes_follow_the_split"], ci=False),
    # --- profiler ------------------------------------------------------------------------------------------
    dict(name="profiler-cpu-batching-ignores-thread-count", file="morphpipe/profiler/operators.py",
         find="num_threads=threads,",
         replace="num_threads=session.thread_counts[-1],",
         tests=[f"{GUARDS}::test_cpu_batching_operator_runs_each_thread_count"], ci=True),
    dict(name="profiler-cpu-training-ignores-thread-count", file="morphpipe/profiler/operators.py",
         find="            torch.set_num_threads(threads)\n",
         replace="            torch.set_num_threads(saved_threads)\n",
         tests=[f"{GUARDS}::test_cpu_training_operator_runs_with_each_thread_count"], ci=False),
    dict(name="thread-scaling-stops-growing", file="morphpipe/profiler/profile.py",
         find="return rates[-1] + (p - counts[-1]) * self.marginal_rate()",
         replace="return rates[-1]",
         tests=["tests/profiler/test_profile.py"], ci=False),
    # --- ops (Python) -------------------------------------------------------------------------------------
    dict(name="gcn-scales-self-loop-on-every-source", file="morphpipe/ops/reference.py",
         find="src_degree[: block.num_dst] += 1",
         replace="src_degree += 1",
         tests=["tests/ops/test_reference.py::test_gcn_aggregate_matches_loop"], ci=True),
    dict(name="reference-mean-divides-by-degree-plus-one", file="morphpipe/ops/reference.py",
         find="out = out / in_degrees(block).clamp(min=1).to(acc).unsqueeze(-1)",
         replace="out = out / (in_degrees(block) + 1).to(acc).unsqueeze(-1)",
         tests=["tests/ops/test_reference.py::test_aggregate_matches_loop"], ci=False),
    dict(name="reference-gat-default-slope", file="morphpipe/ops/reference.py",
         find="score_dst.to(acc).index_select(0, dst), negative_slope",
         replace="score_dst.to(acc).index_select(0, dst), 0.2",
         tests=[f"{WIDE}::test_gat_at_every_width_heads_and_slope"], ci=False),
    dict(name="fused-gat-forward-default-slope", file="morphpipe/ops/fused.py",
         find="""                                                         negative_slope, self_loop, row_order)""",
         replace="""                                                         0.2, self_loop, row_order)""",
         tests=[f"{WIDE}::test_gat_slope_changes_the_result"], ci=False),
    dict(name="fused-gat-backward-default-slope", file="morphpipe/ops/fused.py",
         find="grad, ctx.negative_slope,",
         replace="grad, 0.2,",
         tests=[f"{WIDE}::test_gat_at_every_width_heads_and_slope"], ci=False),
    dict(name="fused-dense-self-loop-unscaled", file="morphpipe/ops/fused.py",
         find="if src_scale is None else src_scale[loops]",
         replace="if src_scale is None else torch.ones_like(src_scale[loops])",
         tests=[f"{WIDE}::test_gcn_at_every_width"], ci=False),
    dict(name="fused-mean-divides-by-degree-plus-one", file="morphpipe/ops/fused.py",
         find="dst_scale = 1.0 / in_degrees(block).clamp(min=1).to(acc)",
         replace="dst_scale = 1.0 / (in_degrees(block) + 1).to(acc)",
         tests=[f"{WIDE}::test_weighted_sum_and_mean_at_every_width"], ci=False),
    # --- nn --------------------------------------------------------------------------------------------------
    dict(name="gat-conv-project-first-default-slope", file="morphpipe/nn/gat.py",
         find="gat_attention(block, z, score_src, score_dst, self.negative_slope, add_self_loops=True)",
         replace="gat_attention(block, z, score_src, score_dst, 0.2, add_self_loops=True)",
         tests=[f"{NN}::test_gat_conv_with_its_slope_and_heads_matches_the_definition"], ci=False),
    dict(name="gat-conv-aggregate-first-default-slope", file="morphpipe/nn/gat.py",
         find="gat_attention(block, h_src.unsqueeze(1), score_src, score_dst, self.negative_slope,",
         replace="gat_attention(block, h_src.unsqueeze(1), score_src, score_dst, 0.2,",
         tests=[f"{NN}::test_gat_conv_with_its_slope_and_heads_matches_the_definition"], ci=False),
    dict(name="dropout-fixed-p", file="morphpipe/nn/base.py",
         find="p=self.dropout",
         replace="p=0.5",
         tests=[f"{NN}::test_dropout_drops_its_share_and_rescales"], ci=False),
    # --- data validation --------------------------------------------------------------------------------------
    dict(name="validation-indptr-end-only-too-long", file="morphpipe/data/validation.py",
         find="if offsets[-1] != num_edges:",
         replace="if offsets[-1] > num_edges:",
         tests=["tests/data/test_validation.py"], ci=False),
    dict(name="validation-labels-off-by-one", file="morphpipe/data/validation.py",
         find="values.max() >= num_classes",
         replace="values.max() > num_classes",
         tests=["tests/data/test_validation.py"], ci=False),
    dict(name="huge-pages-overrides-the-user", file="morphpipe/huge_pages.py",
         find="""    if user is not None:
        return HugePages(user.strip() not in ("", "0"), "user", mode)""",
         replace="""    if user is not None and False:
        return HugePages(user.strip() not in ("", "0"), "user", mode)""",
         tests=["tests/test_huge_pages.py::test_the_users_setting_wins_and_is_not_touched"], ci=False),
    dict(name="replan-reprofiles-quiet-profiles", file="morphpipe/executor/replan.py",
         find="if self.reprofile is None or self.reprofiled or not self.profile.taken_on_busy_machine or not faster:",
         replace="if self.reprofile is None or self.reprofiled or not faster:",
         tests=["tests/executor/test_replan.py::test_a_quiet_profile_is_never_taken_again"], ci=False),
    # --- C++ kernels (csrc/cpu; --all only) -----------------------------------------------------------------
    dict(name="cpp-dropout-mask-bits-packed-reversed", file="csrc/cpu/bias_act_dropout.cpp",
         find="word |= static_cast<uint32_t>((bytes * 0x0102040810204080ULL) >> 56) << (8 * part);",
         replace="word |= static_cast<uint32_t>((bytes * 0x8040201008040201ULL) >> 56) << (8 * part);",
         tests=["tests/ops/test_bias_act_dropout.py::test_the_mask_is_the_specified_counter_based_hash"], ci=False),
    dict(name="cpp-sum-tile-accumulator-not-reset", file="csrc/cpu/aggregate.cpp",
         find="""      std::fill(buf, buf + n, acc_t(0));
      if (self) axpy(buf, x + i * F + f0, ss ? ss[i] : acc_t(1), n);""",
         replace="""      if (f0 == 0) std::fill(buf, buf + n, acc_t(0));
      if (self) axpy(buf, x + i * F + f0, ss ? ss[i] : acc_t(1), n);""",
         tests=[f"{WIDE}::test_weighted_sum_and_mean_at_every_width"], ci=False),
    dict(name="cpp-gat-gradient-default-slope", file="csrc/cpu/gat.cpp",
         find="return raw > acc_t(0) ? acc_t(1) : slope;",
         replace="return raw > acc_t(0) ? acc_t(1) : acc_t(0.2);",
         tests=[f"{WIDE}::test_gat_at_every_width_heads_and_slope"], ci=False),
    dict(name="cpp-batcher-sampling-ignores-epoch", file="csrc/cpu/cpu_batcher.cpp",
         find="epoch_seed_ = splitmix64(static_cast<uint64_t>(epoch_seed));",
         replace="epoch_seed_ = splitmix64(static_cast<uint64_t>(0));",
         tests=[RANDOM], ci=False),
]
