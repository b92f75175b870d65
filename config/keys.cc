#include "config/keys.h"

namespace zerostep {
namespace config_keys {

const std::vector<std::string> kTopSupported = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "managed_gradient_accumulation",
    "gradient_accumulation_scaling",
    "optimizer",
    "gradient_clipping",
    "steps_per_print",
    "zero_optimization",
    "fp16",
    "bf16",
    "bfloat16",
    "data_types",
    "amp",
};

const std::vector<std::string> kTopIgnored = {
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "activation_checkpointing",
    "wall_clock_breakdown",
    "memory_breakdown",
    "dump_state",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "communication_data_type",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "aio",
    "autotuning",
    "elasticity",
    "data_efficiency",
    "curriculum_learning",
    "compression_training",
    "checkpoint",
    "seq_parallel_communication_data_type",
    "eigenvalue",
    "progressive_layer_drop",
    "quantize_training",
    "sparse_attention",
    "load_universal_checkpoint",
    "use_node_local_storage",
    "nebula",
    "weight_quantization",
    "hybrid_engine",
};

const std::vector<std::string> kTopRejected = {
    "scheduler",
    "pipeline",
    "pipeline_parallel_size",
};

const std::vector<std::string> kZeroSupported = {
    "stage",
    "overlap_comm",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "contiguous_gradients",
    "stage3_param_persistence_threshold",
    "offload_optimizer",
    "offload_param",
    "sub_group_size",
    "cpu_offload",
};

const std::vector<std::string> kZeroIgnored = {
    "reduce_scatter",
    "allgather_partitions",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_prefetch_bucket_size",
    "stage3_gather_16bit_weights_on_model_save",
    "round_robin_gradients",
    "elastic_checkpoint",
    "ignore_unused_parameters",
    "load_from_fp32_weights",
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "mics_shard_size",
    "memory_efficient_linear",
};

const std::vector<std::string> kOffloadKeys = {
    "device",        "nvme_path",      "pin_memory", "buffer_count",
    "buffer_size",   "max_in_cpu",     "fast_init",  "ratio",
    "pipeline_read", "pipeline_write", "pipeline"};

const std::vector<std::string> kOptimizerKeys = {"type", "params"};
const std::vector<std::string> kOptimizerParams = {"lr", "betas", "eps",
                                                   "weight_decay", "momentum"};
// Note: adam_w_mode is read (for "Adam") before the ignored list is
// consulted; it stays listed here for did-you-mean suggestions.
const std::vector<std::string> kOptimizerParamsIgnored = {"torch_adam",
                                                          "adam_w_mode"};

const std::vector<std::string> kFp16Keys = {
    "enabled",           "loss_scale", "initial_scale_power",
    "loss_scale_window", "hysteresis", "consecutive_hysteresis",
    "min_loss_scale",    "auto_cast",  "fp16_master_weights_and_grads"};
const std::vector<std::string> kBf16Keys = {"enabled", "immediate_grad_update",
                                            "check_grad_overflow"};
const std::vector<std::string> kDataTypesKeys = {"grad_accum_dtype"};

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

}  // namespace config_keys
}  // namespace zerostep
