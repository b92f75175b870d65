#include "config/keys.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <utility>

namespace zerostep {
namespace config_keys {
namespace {

using Json = nlohmann::ordered_json;

// --- what "harmless" means, per kind of key (Note [Key decisions]) ---

bool is_false(const Json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const Json& v) { return v.is_boolean() && v.get<bool>(); }
// DeepSpeed reads these with dict.get(), so null is its default (falsy).
bool false_or_null(const Json& v) { return v.is_null() || is_false(v); }
bool true_or_null(const Json& v) { return v.is_null() || is_true(v); }
bool is_null(const Json& v) { return v.is_null(); }
bool is_one(const Json& v) { return v.is_number() && v.get<double>() == 1.0; }
bool is_zero(const Json& v) { return v.is_number() && v.get<double>() == 0.0; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(c));
  return s;
}

bool is_string_ci(const Json& v, const char* want) {
  return v.is_string() && lower(v.get<std::string>()) == want;
}
// DeepSpeed lower-cases both before comparing.
bool fp32_or_null(const Json& v) {
  return v.is_null() || is_string_ci(v, "fp32");
}
bool is_mean(const Json& v) { return is_string_ci(v, "mean"); }

// A section gated by "enabled" switches (its own and its features'): null,
// or an object in which every "enabled", at any depth, is false or null.
// Anything else (true, "yes", a section written as a bare true) may turn a
// feature on.
bool nothing_enabled(const Json& v) {
  if (v.is_null()) return true;
  if (!v.is_object()) return false;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const Json& x = it.value();
    if (it.key() == "enabled") {
      if (!false_or_null(x)) return false;
    } else if (x.is_object()) {
      if (!nothing_enabled(x)) return false;
    } else if (x.is_array()) {
      for (const Json& e : x)
        if (e.is_object() && !nothing_enabled(e)) return false;
    }
  }
  return true;
}

// "compile": DeepSpeed 0.13-0.14 compiled with torch.compile when
// "enabled" was true; since 0.17 "deepcompile" switches DeepCompile on.
bool compile_off(const Json& v) {
  if (!nothing_enabled(v)) return false;
  if (v.is_null()) return true;
  auto it = v.find("deepcompile");
  return it == v.end() || false_or_null(*it);
}

// A size that splits nothing: absent, or a number <= 1 (0 means off).
bool at_most_one(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return true;
  return it->is_number() && it->get<double>() <= 1.0;
}

// "tensor_parallel": AutoTP splits layers when autotp_size > 1; the nested
// "tp" (also spelt "tensor_parallel") object's tp_size must then agree.
bool tensor_parallel_off(const Json& v) {
  if (v.is_null()) return true;
  if (!v.is_object()) return false;
  if (!at_most_one(v, "autotp_size")) return false;
  for (const char* nested : {"tp", "tensor_parallel"}) {
    auto it = v.find(nested);
    if (it == v.end() || it->is_null()) continue;
    if (!it->is_object() || !at_most_one(*it, "tp_size")) return false;
  }
  return true;
}

bool empty_or_absent(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() || (it->is_object() && it->empty());
}

// "weight_quantization" (DeepSpeed's WeightQuantConfig, enabled by default)
// quantizes weights only through quantized_initialization or
// post_init_quant.
bool weight_quantization_off(const Json& v) {
  if (v.is_null()) return true;
  if (!v.is_object()) return false;
  auto enabled = v.find("enabled");
  if (enabled != v.end() && is_false(*enabled)) return true;
  return empty_or_absent(v, "quantized_initialization") &&
         empty_or_absent(v, "post_init_quant");
}

// --- rows ---

constexpr Treatment R = Treatment::kRead;
constexpr Treatment I = Treatment::kIgnored;
constexpr Treatment W = Treatment::kIgnoredWhen;
constexpr Treatment X = Treatment::kRejected;

DeepSpeedKey read(const char* path, const char* why,
                  const char* alias_of = nullptr) {
  return {path, R, nullptr, nullptr, why, nullptr, nullptr, alias_of};
}
DeepSpeedKey ignored(const char* path, const char* why,
                     const char* alias_of = nullptr) {
  return {path, I, nullptr, nullptr, why, nullptr, nullptr, alias_of};
}
DeepSpeedKey ignored_when(const char* path, bool (*harmless)(const Json&),
                          const char* when, const char* why, const char* fix,
                          const char* rule = nullptr) {
  return {path, W, harmless, when, why, rule, fix, nullptr};
}
DeepSpeedKey rejected(const char* path, const char* why, const char* fix,
                      const char* rule = nullptr) {
  return {path, X, nullptr, nullptr, why, rule, fix, nullptr};
}

constexpr const char* kSetFalse = "remove it or set it to false";
constexpr const char* kDisable = "remove it or set enabled to false";
constexpr const char* kPerfOnly =
    "performance or memory only: the same numbers either way";
// fp16's loss-scaling keys copied into a bf16 section: DeepSpeed's bf16
// never scales the loss and never read them (up to 0.17.0 it ignored
// every other bf16 key; its pydantic schema since 0.17.1 refuses them).
constexpr const char* kBf16NoLossScale =
    "fp16's loss scaling, which bf16 does not do: never read";
constexpr const char* kNotADeepSpeedKey =
    "not a key DeepSpeed reads (it ignores unknown top-level keys); "
    "accepted as harmless";

}  // namespace

const std::vector<DeepSpeedKey> kDeepSpeedKeys = {
    // --- batch size ---
    read("train_batch_size", "samples per optimizer step over all ranks"),
    read("train_micro_batch_size_per_gpu",
         "samples per rank per forward and backward"),
    read("gradient_accumulation_steps",
         "backward passes per optimizer step in managed mode"),
    read("managed_gradient_accumulation",
         "who decides the accumulation boundary (DeepSpeed has it since "
         "0.19.4)"),
    read("gradient_accumulation_scaling",
         "zerostep's own key: how a window's gradients are scaled"),

    // --- optimizer ---
    read("optimizer", "the optimizer; Adam, AdamW and SGD are implemented"),
    read("optimizer.type", "Adam, AdamW or SGD"),
    read("optimizer.params", "the optimizer's hyper-parameters"),
    ignored("optimizer.legacy_fusion",
            "fusion of DeepSpeed's old fp16 optimizer kernels: speed only"),
    read("optimizer.params.lr", "the learning rate"),
    read("optimizer.params.betas", "Adam's moment decay rates"),
    read("optimizer.params.eps", "Adam's denominator term"),
    read("optimizer.params.weight_decay", "decoupled (AdamW) or L2 decay"),
    read("optimizer.params.momentum", "SGD's momentum"),
    read("optimizer.params.adam_w_mode",
         "Adam: false selects L2 weight decay instead of AdamW's decoupled "
         "decay"),
    ignored("optimizer.params.torch_adam",
            "torch.optim's Adam instead of DeepSpeed's fused kernel: the "
            "same update"),
    read("optimizer.params.bias_correction",
         "Adam and AdamW: false drops the bias correction of both moments "
         "(DeepSpeed's FusedAdam and CPU Adam)"),
    ignored_when("optimizer.params.amsgrad", is_false, "false",
                 "AMSGrad keeps the maximum of past second moments; "
                 "zerostep's Adam is plain Adam",
                 kSetFalse),
    ignored_when("optimizer.params.maximize", is_false, "false",
                 "ascends the objective instead of descending it", kSetFalse),
    ignored_when("optimizer.params.fp32_optimizer_states", true_or_null,
                 "true or null",
                 "false keeps DeepSpeedCPUAdam's moments in bf16 or fp16; "
                 "zerostep keeps them in fp32",
                 "remove it or set it to true"),
    ignored("optimizer.params.set_grad_none",
            "FusedAdam's zero_grad frees gradients: memory only"),
    ignored("optimizer.params.foreach",
            "a torch.optim implementation choice: the same update"),
    ignored("optimizer.params.fused",
            "a torch.optim implementation choice: the same update"),
    ignored("optimizer.params.capturable",
            "a torch.optim implementation choice: the same update"),
    ignored("optimizer.params.differentiable",
            "a torch.optim implementation choice: the same update"),
    ignored_when("optimizer.params.nesterov", is_false, "false",
                 "SGD with Nesterov momentum; zerostep's SGD uses plain "
                 "momentum",
                 kSetFalse),
    ignored_when("optimizer.params.dampening", is_zero, "0",
                 "SGD's momentum dampening; zerostep's SGD has none",
                 "remove it or set it to 0"),
    rejected("optimizer.params.max_grad_norm",
             "a clipping norm given to the optimizer",
             "remove it and write \"gradient_clipping\": <norm> at the top "
             "level",
             "is not an optimizer parameter (DeepSpeed raises ValueError "
             "for it)"),

    // --- scheduler (parameters: config/scheduler.h) ---
    read("scheduler", "WarmupLR, WarmupDecayLR or WarmupCosineLR"),
    read("scheduler.type", "the schedule's class name"),
    read("scheduler.params", "the schedule's parameters (config/scheduler.h)"),

    // --- communication ---
    ignored_when("communication_data_type", fp32_or_null, "null or \"fp32\"",
                 "the dtype gradients are averaged in; zerostep averages in "
                 "fp32",
                 "remove it or write \"fp32\""),
    ignored_when("gradient_allreduce_op", is_mean, "\"mean\"",
                 "\"sum\" keeps the sum over ranks instead of the mean",
                 "remove it or write \"mean\""),
    read("prescale_gradients",
         "divides each rank's gradient by the world size before the sum "
         "instead of the sum after it"),
    read("gradient_predivide_factor",
         "multiplies each rank's gradient by 1 / factor before the sum and "
         "the sum by factor / world size after it"),
    ignored_when("sparse_gradients", false_or_null, "false or null",
                 "averages embedding gradients as sparse tensors", kSetFalse),
    ignored("disable_allgather", "not read by DeepSpeed's engine"),
    ignored("seq_parallel_communication_data_type",
            "sequence-parallel communication; zerostep has no sequence "
            "parallelism"),
    ignored_when("sequence_parallel_size", is_one, "1",
                 "splits each sequence over several ranks (Ulysses), which "
                 "changes the data-parallel world size and so the batch",
                 "remove it or set it to 1"),

    // --- mixed precision ---
    read("fp16", "fp16 training with loss scaling"),
    read("fp16.enabled", "turns fp16 training on"),
    read("fp16.loss_scale", "0: dynamic; > 0: static scale"),
    read("fp16.initial_scale_power", "the dynamic scale starts at 2^power"),
    read("fp16.loss_scale_window", "clean iterations before the scale grows"),
    read("fp16.hysteresis", "overflows absorbed before the scale shrinks"),
    read("fp16.consecutive_hysteresis", "refills the hysteresis"),
    read("fp16.min_loss_scale", "the scale's floor"),
    ignored_when("fp16.auto_cast", is_false, "false",
                 "casts the model's floating-point inputs to fp16; zerostep "
                 "hands inputs to the model unchanged",
                 kSetFalse),
    ignored_when("fp16.fp16_master_weights_and_grads", is_false, "false",
                 "keeps master weights and gradients in fp16; zerostep keeps "
                 "them in fp32",
                 kSetFalse),
    read("bf16", "bf16 training (DeepSpeed also reads the old name bfloat16)"),
    read("bfloat16", "DeepSpeed's old name of bf16"),
    read("bf16.enabled", "turns bf16 training on"),
    ignored("bf16.immediate_grad_update",
            "whether a micro-batch's bf16 gradient joins the fp32 "
            "accumulation during or after backward: the same sums"),
    ignored("bf16.loss_scale", kBf16NoLossScale),
    ignored("bf16.initial_scale_power", kBf16NoLossScale),
    ignored("bf16.loss_scale_window", kBf16NoLossScale),
    ignored("bf16.hysteresis", kBf16NoLossScale),
    ignored("bf16.consecutive_hysteresis", kBf16NoLossScale),
    ignored("bf16.min_loss_scale", kBf16NoLossScale),
    ignored_when("bf16.check_grad_overflow", is_false, "false",
                 "skips a step whose gradients are not finite (DeepSpeed's "
                 "default since 0.19.3); zerostep checks only with fp16",
                 kSetFalse),
    ignored_when("bf16.bf16_master_weights_and_grads", is_false, "false",
                 "keeps master weights and gradients in bf16; zerostep keeps "
                 "them in fp32",
                 kSetFalse),
    ignored_when("bf16.bf16_optimizer_states", is_false, "false",
                 "keeps the optimizer state in bf16; zerostep keeps it in "
                 "fp32",
                 kSetFalse),
    ignored_when("amp", nothing_enabled, "enabled is false or absent",
                 "NVIDIA Apex AMP",
                 "remove it or set enabled to false; for mixed precision "
                 "write \"bf16\": {\"enabled\": true} or \"fp16\": "
                 "{\"enabled\": true}"),
    ignored_when(
        "torch_autocast", nothing_enabled, "enabled is false or absent",
        "runs the forward under torch.autocast in a lower precision", kDisable),
    read("data_types", "accumulation and model dtypes"),
    read("data_types.grad_accum_dtype",
         "the dtype a window's gradients accumulate in"),
    read("data_types.param_dtype",
         "must name the training dtype (DeepSpeed checks the same)"),
    ignored_when("data_types.buffer_dtype", is_null, "null",
                 "casts the model's buffers to this dtype",
                 "remove it, and convert the buffers yourself if you need to"),

    // --- gradient clipping ---
    read("gradient_clipping", "the global gradient norm's bound"),

    // --- ZeRO ---
    read("zero_optimization",
         "the ZeRO stage and its buffers (DeepSpeed's old \"true\" means "
         "stage 1)"),
    read("allgather_size",
         "DeepSpeed's old allgather_bucket_size, read only with "
         "\"zero_optimization\": true"),
    read("zero_optimization.stage", "0, 1, 2 or 3"),
    read("zero_optimization.overlap_comm",
         "stage 2: reduce buckets during backward; stage 3: the groups' "
         "reduce-scatters in flight during backward"),
    read("zero_optimization.reduce_once_per_step",
         "zerostep's own key: stages 2/3 reduce a window's gradients once, "
         "in step()"),
    read("zero_optimization.gather_once_per_step",
         "zerostep's own key: stage 3 keeps a block gathered until the step, "
         "which gathers every block again for the next window"),
    read("zero_optimization.reduce_bucket_size",
         "elements per gradient reduction; 0 as 1"),
    read("zero_optimization.allgather_bucket_size",
         "elements per parameter all-gather"),
    read("zero_optimization.contiguous_gradients",
         "accepted; gradients are always contiguous here"),
    read("zero_optimization.param_persistence_threshold",
         "stage 3: smaller parameters stay whole on every rank"),
    read("zero_optimization.stage3_param_persistence_threshold",
         "stage 3: smaller parameters stay whole on every rank",
         "zero_optimization.param_persistence_threshold"),
    read("zero_optimization.offload_optimizer",
         "optimizer state in host memory or on NVMe"),
    read("zero_optimization.offload_param",
         "stage 3: parameters on NVMe; ignored below stage 3, as in "
         "DeepSpeed"),
    read("zero_optimization.sub_group_size",
         "elements per NVMe swap sub-group; 0 as 1"),
    read("zero_optimization.cpu_offload",
         "deprecated: true is offload_optimizer.device \"cpu\""),
    read("zero_optimization.cpu_offload_param",
         "deprecated: true is offload_param.device \"cpu\""),
    ignored("zero_optimization.cpu_offload_use_pin_memory",
            "deprecated; DeepSpeed only warns about it"),
    ignored("zero_optimization.reduce_scatter",
            "reduce-scatter or all-reduce to average gradients: the same "
            "mean"),
    ignored("zero_optimization.allgather_partitions",
            "all-gather or broadcasts to share updated parameters: the same "
            "values"),
    ignored("zero_optimization.use_multi_rank_bucket_allreduce", kPerfOnly),
    ignored_when("zero_optimization.load_from_fp32_weights", is_true, "true",
                 "false rebuilds the fp32 master weights from the 16-bit "
                 "model when a checkpoint is loaded; zerostep restores fp32",
                 "remove it or set it to true"),
    ignored("zero_optimization.elastic_checkpoint",
            "a deprecated checkpoint layout option"),
    read("zero_optimization.prefetch_bucket_size",
         "stage 3: the largest block group gathered ahead of its use; 0: "
         "no prefetch; \"auto\": the default, 5e7"),
    read("zero_optimization.stage3_prefetch_bucket_size",
         "stage 3: the largest block group gathered ahead of its use; 0: "
         "no prefetch; \"auto\": the trainer's 0.9 × hidden size squared "
         "(below stage 3 the default, 5e7)",
         "zero_optimization.prefetch_bucket_size"),
    ignored("zero_optimization.model_persistence_threshold",
            "caps the elements kept whole by the persistence threshold: "
            "memory only"),
    ignored("zero_optimization.stage3_model_persistence_threshold",
            "caps the elements kept whole by the persistence threshold: "
            "memory only",
            "zero_optimization.model_persistence_threshold"),
    read("zero_optimization.max_live_parameters",
         "stage 3: prefetch only while the gathered block groups stay "
         "within this many elements; \"auto\": the default, 1e9"),
    read("zero_optimization.stage3_max_live_parameters",
         "stage 3: prefetch only while the gathered block groups stay "
         "within this many elements; \"auto\": the default, 1e9",
         "zero_optimization.max_live_parameters"),
    read("zero_optimization.max_reuse_distance",
         "stage 3: a block stays gathered from its forward to its backward "
         "when fewer elements run in between; 0: released after every "
         "forward; \"auto\": the default, 1e9"),
    read("zero_optimization.stage3_max_reuse_distance",
         "stage 3: a block stays gathered from its forward to its backward "
         "when fewer elements run in between; 0: released after every "
         "forward; \"auto\": the default, 1e9",
         "zero_optimization.max_reuse_distance"),
    ignored("zero_optimization.gather_16bit_weights_on_model_save",
            "what save_16bit_model() writes: checkpoint output only"),
    ignored("zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "what save_16bit_model() writes: checkpoint output only",
            "zero_optimization.gather_16bit_weights_on_model_save"),
    ignored("zero_optimization.stage3_gather_fp16_weights_on_model_save",
            "deprecated name of gather_16bit_weights_on_model_save",
            "zero_optimization.gather_16bit_weights_on_model_save"),
    ignored("zero_optimization.module_granularity_threshold",
            "stage 3 fetch granularity: performance only"),
    ignored("zero_optimization.stage3_module_granularity_threshold",
            "stage 3 fetch granularity: performance only",
            "zero_optimization.module_granularity_threshold"),
    ignored("zero_optimization.use_all_reduce_for_fetch_params",
            "stage 3 gathers with all-reduce: the same values"),
    ignored("zero_optimization.stage3_use_all_reduce_for_fetch_params",
            "stage 3 gathers with all-reduce: the same values",
            "zero_optimization.use_all_reduce_for_fetch_params"),
    ignored("zero_optimization.allgather_sequential",
            "stage 3 gathers parameters one by one: the same values"),
    ignored("zero_optimization.stage3_allgather_sequential",
            "stage 3 gathers parameters one by one: the same values",
            "zero_optimization.allgather_sequential"),
    ignored("zero_optimization.ignore_unused_parameters",
            "whether stage 2 raises on unused parameters: a check only"),
    ignored("zero_optimization.legacy_stage1",
            "DeepSpeed's old stage 1 implementation"),
    ignored("zero_optimization.round_robin_gradients",
            "spreads gradient copies to the host over ranks: performance "
            "only"),
    ignored("zero_optimization.zero_hpz_partition_size",
            "ZeRO++ secondary parameter partition: performance only"),
    ignored_when("zero_optimization.zero_quantized_weights", is_false, "false",
                 "ZeRO++ all-gathers weights quantized to int8", kSetFalse),
    ignored_when("zero_optimization.zero_quantized_nontrainable_weights",
                 is_false, "false", "stores frozen weights quantized",
                 kSetFalse),
    ignored_when("zero_optimization.zero_quantized_gradients", is_false,
                 "false", "ZeRO++ reduces gradients quantized to int4",
                 kSetFalse),
    ignored("zero_optimization.zeropp_loco_param",
            "error feedback for zero_quantized_gradients (rejected when on)"),
    ignored("zero_optimization.mics_shard_size",
            "MiCS: shards within groups of ranks: the same mean"),
    ignored("zero_optimization.mics_hierarchical_params_gather", kPerfOnly),
    ignored("zero_optimization.memory_efficient_linear", kPerfOnly),
    ignored("zero_optimization.pipeline_loading_checkpoint",
            "stage 3 checkpoint loading with pipelines"),
    ignored("zero_optimization.override_module_apply", kPerfOnly),
    ignored("zero_optimization.log_trace_cache_warnings", "logging only"),
    ignored("zero_optimization.enable_sanity_checks", "checks only"),
    ignored("zero_optimization.save_muon_momentum_buffer_in_memory",
            "Muon with NVMe offload (Muon is not implemented)"),
    ignored("zero_optimization.leaf_module",
            "stage 3 fetch granularity: performance only"),
    ignored_when("zero_optimization.zenflow", is_null, "null",
                 "ZenFlow updates unimportant gradients late, on the host",
                 "remove it"),

    // --- offload ---
    read("zero_optimization.offload_optimizer.device", "none, cpu or nvme"),
    read("zero_optimization.offload_optimizer.nvme_path",
         "the directory of the swap file"),
    read("zero_optimization.offload_optimizer.pin_memory",
         "accepted; no effect on a CPU build"),
    read("zero_optimization.offload_optimizer.buffer_count",
         "buffers of the NVMe swapper"),
    ignored("zero_optimization.offload_optimizer.pipeline_read", kPerfOnly),
    ignored("zero_optimization.offload_optimizer.pipeline_write", kPerfOnly),
    ignored("zero_optimization.offload_optimizer.pipeline",
            "derived by DeepSpeed from pipeline_read and pipeline_write"),
    ignored("zero_optimization.offload_optimizer.fast_init", kPerfOnly),
    ignored("zero_optimization.offload_optimizer.ratio",
            "the share of the state offloaded: performance only"),
    ignored("zero_optimization.offload_optimizer.super_offload", kPerfOnly),
    ignored("zero_optimization.offload_optimizer.cpuadam_cores_perc",
            kPerfOnly),
    read("zero_optimization.offload_param.device", "none, cpu or nvme"),
    read("zero_optimization.offload_param.nvme_path",
         "the directory of the swap file"),
    read("zero_optimization.offload_param.pin_memory",
         "accepted; no effect on a CPU build"),
    read("zero_optimization.offload_param.buffer_count",
         "buffers of the NVMe swapper"),
    ignored("zero_optimization.offload_param.buffer_size", kPerfOnly),
    ignored("zero_optimization.offload_param.max_in_cpu", kPerfOnly),
    ignored("aio", "asynchronous I/O tuning of the NVMe swapper"),

    // --- parallelism zerostep does not have ---
    ignored_when("tensor_parallel", tensor_parallel_off,
                 "autotp_size and tp.tp_size absent or at most 1",
                 "AutoTP splits layers over ranks",
                 "remove it or set autotp_size to 1"),
    ignored_when("expert_parallel", nothing_enabled,
                 "enabled is false or absent",
                 "AutoEP replaces mixture-of-experts layers", kDisable),
    ignored_when("hybrid_engine", nothing_enabled, "enabled is false or absent",
                 "switches the model to DeepSpeed's inference kernels for "
                 "generation (RLHF)",
                 kDisable),
    rejected("pipeline", "pipeline parallelism",
             "remove it (see docs/config.md)"),
    ignored_when("pipeline_parallel_size", is_one, "1", "pipeline parallelism",
                 "remove it"),
    ignored("use_data_before_expert_parallelism",
            "rank order of expert parallelism; zerostep has none"),

    // --- logging, monitoring, profiling ---
    read("steps_per_print", "progress report interval"),
    ignored("wall_clock_breakdown", "timing only"),
    ignored("dump_state", "logging only"),
    ignored("memory_breakdown", "logging only"),
    ignored("log_level", "logging only"),
    ignored("timers", "throughput timers: logging only"),
    ignored("flops_profiler", "profiling only"),
    ignored("tensorboard", "monitoring only"),
    ignored("wandb", "monitoring only"),
    ignored("csv_monitor", "monitoring only"),
    ignored("comet", "monitoring only"),
    ignored("comms_logger", "communication logging only"),
    ignored("comms_config", kNotADeepSpeedKey),
    ignored("monitor_config", kNotADeepSpeedKey),
    ignored("cuda_visible_devices", kNotADeepSpeedKey),
    ignored("log", kNotADeepSpeedKey),
    ignored_when("autotuning", nothing_enabled, "enabled is false or absent",
                 "an autotuning experiment: the engine profiles a few steps "
                 "and exits",
                 kDisable),

    // --- memory ---
    ignored("activation_checkpointing",
            "how deepspeed.checkpointing stores activations: memory only, "
            "the same values"),

    // --- features that change what is trained ---
    rejected("sparse_attention",
             "configures DeepSpeed's block-sparse attention, which a model "
             "built for DeepSpeed runs in place of dense attention",
             "remove it"),
    ignored_when(
        "data_efficiency", nothing_enabled, "no \"enabled\": true inside",
        "curriculum data sampling and random layer token drop", kDisable),
    ignored_when("curriculum_learning", nothing_enabled,
                 "enabled is false or absent",
                 "DeepSpeed's legacy curriculum learning shortens early "
                 "sequences",
                 kDisable),
    ignored_when("elasticity", nothing_enabled, "enabled is false or absent",
                 "chooses the batch sizes from the number of GPUs", kDisable),
    ignored_when("compression_training", nothing_enabled,
                 "no \"enabled\": true inside",
                 "quantization, pruning and layer reduction during training",
                 "remove it or set every enabled in it to false"),
    ignored_when("eigenvalue", nothing_enabled, "enabled is false or absent",
                 "Hessian eigenvalues that schedule quantization", kDisable),
    ignored_when("progressive_layer_drop", nothing_enabled,
                 "enabled is false or absent",
                 "randomly skips transformer layers", kDisable),
    ignored_when("quantize_training", nothing_enabled,
                 "enabled is false or absent",
                 "MoQ quantizes weights during training", kDisable),
    ignored_when("weight_quantization", weight_quantization_off,
                 "enabled is false, or no quantized_initialization or "
                 "post_init_quant",
                 "stores the weights quantized from initialization",
                 "remove it or set enabled to false"),
    ignored_when("compile", compile_off,
                 "enabled and deepcompile false or absent",
                 "compiles the model (torch.compile, DeepCompile)",
                 "remove it or set enabled and deepcompile to false"),
    ignored("graph_harvesting", kPerfOnly),

    // --- checkpoints, data loading, the rest ---
    ignored("checkpoint", "checkpoint tags and writers: I/O only"),
    ignored("load_universal_checkpoint",
            "checkpoint loading; DeepSpeed reads it as "
            "checkpoint.load_universal"),
    ignored("use_node_local_storage",
            "checkpoint storage; DeepSpeed reads it under \"checkpoint\""),
    ignored("nebula", "checkpoint service: I/O only"),
    ignored("datastates_ckpt", "checkpoint engine: I/O only"),
    ignored("dataloader_drop_last",
            "DeepSpeed's own data loader; the caller feeds zerostep's "
            "batches"),
    ignored("vocabulary_size", "DeepSpeed only warns about its alignment"),
    ignored("zero_allow_untested_optimizer",
            "permits client optimizers; zerostep has its own only"),
    ignored("zero_force_ds_cpu_optimizer",
            "which host Adam kernel DeepSpeed uses: the same update"),
};

namespace {

// The keys of "bfloat16" are those of "bf16".
std::string bf16_name(const std::string& path) {
  return path.rfind("bfloat16.", 0) == 0 ? "bf16." + path.substr(9) : path;
}

}  // namespace

const DeepSpeedKey* find_key(const std::string& path) {
  const std::string p = bf16_name(path);
  for (const DeepSpeedKey& k : kDeepSpeedKeys)
    if (p == k.path) return &k;
  return nullptr;
}

std::vector<std::string> names_under(const std::string& section) {
  std::string prefix = section.empty() ? "" : section + ".";
  if (prefix == "bfloat16.") prefix = "bf16.";
  std::vector<std::string> names;
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    const std::string p = k.path;
    if (p.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = p.substr(prefix.size());
    if (rest.find('.') == std::string::npos) names.push_back(rest);
  }
  return names;
}

std::string setting_of(const std::string& path) {
  const DeepSpeedKey* k = find_key(path);
  return k != nullptr && k->alias_of != nullptr ? k->alias_of : path;
}

namespace {

// Other frameworks' names, by dotted path (matched in any letter case).
const std::pair<const char*, const char*> kSynonyms[] = {
    // Hugging Face TrainingArguments, Megatron-LM, PyTorch Lightning.
    {"max_grad_norm", "gradient_clipping"},
    {"clip_grad", "gradient_clipping"},
    {"grad_clip", "gradient_clipping"},
    {"clip_grad_norm", "gradient_clipping"},
    {"per_device_train_batch_size", "train_micro_batch_size_per_gpu"},
    {"micro_batch_size", "train_micro_batch_size_per_gpu"},
    {"global_batch_size", "train_batch_size"},
    {"learning_rate", "optimizer.params.lr"},
    {"lr", "optimizer.params.lr"},
    {"weight_decay", "optimizer.params.weight_decay"},
    {"warmup_steps", "scheduler.params.warmup_num_steps"},
    {"lr_scheduler_type", "scheduler.type"},
    // Accelerate's deepspeed_config.
    {"zero_stage", "zero_optimization.stage"},
    {"offload_optimizer_device", "zero_optimization.offload_optimizer.device"},
    {"offload_param_device", "zero_optimization.offload_param.device"},
    {"zero3_save_16bit_model",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    // Inside the sections.
    {"zero_optimization.comm_overlap", "overlap_comm"},
    {"zero_optimization.overlap_communication", "overlap_comm"},
    {"optimizer.params.learning_rate", "lr"},
    {"optimizer.params.epsilon", "eps"},
    {"optimizer.params.adam_epsilon", "eps"},
    {"optimizer.params.beta1", "betas"},
    {"optimizer.params.beta2", "betas"},
    {"optimizer.params.adam_beta1", "betas"},
    {"optimizer.params.adam_beta2", "betas"},
    {"scheduler.params.num_warmup_steps", "warmup_num_steps"},
    {"scheduler.params.warmup_steps", "warmup_num_steps"},
    {"scheduler.params.num_training_steps", "total_num_steps"},
    {"scheduler.params.total_steps", "total_num_steps"},
};

}  // namespace

std::string synonym(const std::string& path) {
  const std::string p = lower(path);
  for (const auto& [from, to] : kSynonyms)
    if (p == from) return to;
  return "";
}

std::string markdown_table() {
  std::string s;
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    std::string decision;
    switch (k.treatment) {
      case Treatment::kRead:
        decision = "read";
        break;
      case Treatment::kIgnored:
        decision = "ignored";
        break;
      case Treatment::kIgnoredWhen:
        decision = std::string("ignored when ") + k.harmless_when +
                   "; otherwise rejected";
        break;
      case Treatment::kRejected:
        decision = "rejected";
        break;
    }
    if (k.alias_of != nullptr)
      decision += std::string(" (alias of `") + k.alias_of + "`)";
    s += std::string("| `") + k.path + "` | " + decision + " | " + k.why +
         " |\n";
  }
  return s;
}

namespace {

std::vector<std::string> read_names(const std::string& section) {
  std::vector<std::string> names;
  for (const std::string& n : names_under(section)) {
    const std::string path = section.empty() ? n : section + "." + n;
    if (find_key(path)->treatment == Treatment::kRead) names.push_back(n);
  }
  return names;
}

}  // namespace

const std::vector<std::string> kTopSupported = read_names("");
const std::vector<std::string> kZeroSupported = read_names("zero_optimization");
const std::vector<std::string> kOptimizerKeys = read_names("optimizer");
const std::vector<std::string> kOptimizerParams =
    read_names("optimizer.params");
const std::vector<std::string> kFp16Keys = read_names("fp16");
const std::vector<std::string> kBf16Keys = read_names("bf16");
const std::vector<std::string> kDataTypesKeys = read_names("data_types");

const std::vector<std::string> kSchedulerKeys = {"type", "params"};
const std::vector<std::string> kWarmupLRParams = {
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
const std::vector<std::string> kWarmupDecayLRParams = {
    "total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
    "warmup_type"};
const std::vector<std::string> kWarmupCosineLRParams = {
    "total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
    "warmup_type"};
const std::vector<std::string> kSchedulerParams = {
    "warmup_min_lr", "warmup_max_lr",       "warmup_num_steps",
    "warmup_type",   "total_num_steps",     "warmup_min_ratio",
    "cos_min_ratio", "last_batch_iteration"};

const std::vector<AutoRule> kAutoRules = {
    // transformers' integrations/deepspeed.py, trainer_config_process().
    {"train_micro_batch_size_per_gpu", "per_device_train_batch_size",
     "micro_batch_size", false},
    {"gradient_accumulation_steps", "gradient_accumulation_steps",
     "gradient_accumulation_steps", false},
    {"train_batch_size",
     "world_size × per_device_train_batch_size × "
     "gradient_accumulation_steps",
     "micro_batch_size and gradient_accumulation_steps", false},
    {"gradient_clipping", "max_grad_norm", "max_grad_norm", false},
    {"optimizer.params.lr", "learning_rate", "learning_rate", false},
    {"optimizer.params.betas", "[adam_beta1, adam_beta2]",
     "adam_beta1 and adam_beta2", false},
    {"optimizer.params.eps", "adam_epsilon", "adam_epsilon", false},
    {"optimizer.params.weight_decay", "weight_decay", "weight_decay", false},
    {"scheduler.params.warmup_min_lr", "0, not a trainer value", "", true},
    {"scheduler.params.warmup_max_lr", "learning_rate", "learning_rate", false},
    {"fp16.enabled", "fp16 (or fp16_full_eval)", "dtype", false},
    {"bf16.enabled", "bf16 (or bf16_full_eval)", "dtype", false},
    // trainer_config_finalize().
    {"zero_optimization.reduce_bucket_size", "hidden_size × hidden_size",
     "hidden_size", true},
    {"zero_optimization.stage3_prefetch_bucket_size",
     "int(0.9 × hidden_size × hidden_size) at stage 3", "hidden_size", true},
    {"zero_optimization.stage3_param_persistence_threshold",
     "10 × hidden_size at stage 3", "hidden_size", true},
    {"scheduler.params.total_num_steps", "num_training_steps", "total_steps",
     false},
    {"scheduler.params.warmup_num_steps",
     "warmup_steps when > 0, else ceil(num_training_steps × warmup_ratio)",
     "warmup_steps (or warmup_ratio with total_steps)", false},
};

const AutoRule* find_auto_rule(const std::string& path) {
  const std::string p = bf16_name(path);
  for (const AutoRule& r : kAutoRules)
    if (p == r.path) return &r;
  return nullptr;
}

std::string auto_markdown_table() {
  std::string s;
  for (const AutoRule& r : kAutoRules) {
    const std::string path = r.path;
    s += "| `" + path + "`" +
         (path == "bf16.enabled" ? " (and `bfloat16.enabled`)" : "") + " | " +
         r.rule + " | " + (*r.field == '\0' ? "none" : r.field) + " | " +
         (r.fill_only ? "no" : "yes") + " |\n";
  }
  return s;
}

}  // namespace config_keys
}  // namespace zerostep
