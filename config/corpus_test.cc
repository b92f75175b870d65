// The ds_config corpora: config/testdata/corpus/, files written in the
// shapes real projects use (Hugging Face Trainer templates, RLHF frameworks,
// Megatron-DeepSpeed, ZeRO-Offload and ZeRO-Infinity, ...), and
// config/testdata/real/, files taken as they are from public repositories
// (config/testdata/real/SOURCES.md names each one's repository, path and
// commit). Each NAME.json has NAME.expect beside it:
//
//   # comment lines
//   world_size: <ranks>
//   trainer: <name=value ...>   (optional: the TrainerValues given, in
//                                to_string(TrainerValues)'s format)
//   accept
//   ignored_keys:
//     <key>              (one per line, in order)
//   filled_auto:         (only when some "auto" was filled)
//     <key = value>      (one per line, in order)
//   config:
//     <field>: <value>   (every field of Config, config_text() below)
//
// or
//
//   world_size: <ranks>
//   trainer: ...
//   reject
//   <ConfigError::what(), exactly>
//
// so any change in what the parser makes of a file fails here. A failure
// prints the text the parser produced. tools:harness_config_test runs the
// same files through the harness (whose trainer values must be the ones
// written here).
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/config_test_util.h"

namespace zerostep {
namespace {

const char* const kCorpus = "config/testdata/corpus";
const char* const kReal = "config/testdata/real";

using testing_config::read_file;
using testing_config::runfile;
using testing_config::trainer_values_from_string;

// The file names in `corpus` without extension, sorted, for `ext`.
std::vector<std::string> names_with(const std::string& corpus,
                                    const std::string& ext) {
  std::vector<std::string> names;
  DIR* dir = opendir(runfile(corpus).c_str());
  if (dir == nullptr) return names;
  while (dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    if (n.size() > ext.size() &&
        n.compare(n.size() - ext.size(), ext.size(), ext) == 0)
      names.push_back(n.substr(0, n.size() - ext.size()));
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

// A double as JSON writes it: the shortest text that reads back the same.
std::string num(double d) { return nlohmann::json(d).dump(); }
std::string yes(bool b) { return b ? "true" : "false"; }

std::string offload_text(const std::string& name, const OffloadConfig& o) {
  return "  " + name + ".device: " + to_string(o.device) + "\n  " + name +
         ".nvme_path: \"" + o.nvme_path + "\"\n  " + name +
         ".pin_memory: " + yes(o.pin_memory) + "\n  " + name +
         ".buffer_count: " + std::to_string(o.buffer_count) + "\n";
}

// Every field of a Config, one per line.
std::string config_text(const Config& c) {
  std::ostringstream s;
  s << "  train_batch_size: " << c.train_batch_size << "\n"
    << "  train_micro_batch_size_per_gpu: " << c.train_micro_batch_size_per_gpu
    << "\n"
    << "  gradient_accumulation_steps: " << c.gradient_accumulation_steps
    << "\n"
    << "  managed_gradient_accumulation: "
    << yes(c.managed_gradient_accumulation) << "\n"
    << "  gradient_accumulation_scaling: "
    << to_string(c.gradient_accumulation_scaling) << "\n"
    << "  optimizer.type: " << to_string(c.optimizer.type) << "\n"
    << "  optimizer.lr: " << num(c.optimizer.lr) << "\n"
    << "  optimizer.betas: [" << num(c.optimizer.beta1) << ", "
    << num(c.optimizer.beta2) << "]\n"
    << "  optimizer.eps: " << num(c.optimizer.eps) << "\n"
    << "  optimizer.weight_decay: " << num(c.optimizer.weight_decay) << "\n"
    << "  optimizer.momentum: " << num(c.optimizer.momentum) << "\n"
    << "  optimizer.bias_correction: " << yes(c.optimizer.bias_correction)
    << "\n"
    << "  gradient_clipping: " << num(c.gradient_clipping) << "\n"
    << "  prescale_gradients: " << yes(c.prescale_gradients) << "\n"
    << "  gradient_predivide_factor: " << num(c.gradient_predivide_factor)
    << "\n"
    << "  scheduler.type: " << to_string(c.scheduler.type) << "\n";
  if (c.scheduler.type != LrScheduleSpec::Type::kNone) {
    const LrScheduleSpec& l = c.scheduler;
    s << "  scheduler.warmup_min_lr: " << num(l.warmup_min_lr) << "\n"
      << "  scheduler.warmup_max_lr: "
      << (l.warmup_max_lr ? num(*l.warmup_max_lr) : "default") << "\n"
      << "  scheduler.warmup_num_steps: " << l.warmup_num_steps << "\n"
      << "  scheduler.warmup_type: " << to_string(l.warmup_type) << "\n"
      << "  scheduler.total_num_steps: " << l.total_num_steps << "\n"
      << "  scheduler.warmup_min_ratio: " << num(l.warmup_min_ratio) << "\n"
      << "  scheduler.cos_min_ratio: " << num(l.cos_min_ratio) << "\n";
  }
  const ZeroConfig& z = c.zero;
  s << "  zero.stage: " << z.stage << "\n"
    << "  zero.overlap_comm: " << yes(z.overlap_comm) << "\n"
    << "  zero.reduce_bucket_size: " << z.reduce_bucket_size << "\n"
    << "  zero.allgather_bucket_size: " << z.allgather_bucket_size << "\n"
    << "  zero.contiguous_gradients: " << yes(z.contiguous_gradients) << "\n"
    << "  zero.stage3_param_persistence_threshold: "
    << z.stage3_param_persistence_threshold << "\n"
    << "  zero.stage3_prefetch_bucket_size: " << z.stage3_prefetch_bucket_size
    << "\n"
    << "  zero.stage3_max_reuse_distance: " << z.stage3_max_reuse_distance
    << "\n"
    << "  zero.stage3_max_live_parameters: " << z.stage3_max_live_parameters
    << "\n"
    << "  zero.sub_group_size: " << z.sub_group_size << "\n"
    << offload_text("zero.offload_optimizer", z.offload_optimizer)
    << offload_text("zero.offload_param", z.offload_param);
  const PrecisionConfig& p = c.precision;
  s << "  precision.dtype: " << to_string(p.dtype) << "\n"
    << "  precision.grad_accum_dtype: " << to_string(p.grad_accum_dtype)
    << "\n";
  if (p.dtype == Precision::kFp16) {
    s << "  fp16.loss_scale: " << num(p.loss_scale) << "\n"
      << "  fp16.initial_scale_power: " << p.initial_scale_power << "\n"
      << "  fp16.loss_scale_window: " << p.loss_scale_window << "\n"
      << "  fp16.hysteresis: " << p.hysteresis << "\n"
      << "  fp16.consecutive_hysteresis: " << yes(p.consecutive_hysteresis)
      << "\n"
      << "  fp16.min_loss_scale: " << num(p.min_loss_scale) << "\n";
  }
  s << "  steps_per_print: " << c.steps_per_print << "\n";
  return s.str();
}

// What the parser makes of `json` at `world_size`, in .expect's format
// (after the world_size line).
std::string outcome(const std::string& json, int world_size,
                    const TrainerValues& trainer) {
  try {
    Config c = parse_config(json, world_size, trainer);
    std::string s = "accept\nignored_keys:\n";
    for (const std::string& k : c.ignored_keys) s += "  " + k + "\n";
    if (!c.filled_auto.empty()) {
      s += "filled_auto:\n";
      for (const std::string& f : c.filled_auto) s += "  " + f + "\n";
    }
    return s + "config:\n" + config_text(c);
  } catch (const ConfigError& e) {
    return std::string("reject\n") + e.what() + "\n";
  }
}

// Every file of `corpus` parses as its .expect says.
void check_corpus(const std::string& corpus) {
  const std::vector<std::string> names = names_with(corpus, ".json");
  ASSERT_FALSE(names.empty()) << "no corpus in " << runfile(corpus);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string base = runfile(corpus + "/" + name);
    const std::string json = read_file(base + ".json");
    std::istringstream expect(read_file(base + ".expect"));
    std::string line;
    while (std::getline(expect, line) && !line.empty() && line[0] == '#') {
    }
    const std::string prefix = "world_size: ";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << "first line: " << line;
    const int world_size = std::stoi(line.substr(prefix.size()));
    TrainerValues trainer;
    const std::string trainer_prefix = "trainer: ";
    std::string trainer_line;
    if (expect.peek() == 't') {
      std::getline(expect, trainer_line);
      ASSERT_EQ(trainer_line.rfind(trainer_prefix, 0), 0u) << trainer_line;
      trainer = trainer_values_from_string(
          trainer_line.substr(trainer_prefix.size()));
      // The line is what to_string writes, so the harness can print it.
      EXPECT_EQ(trainer_prefix + to_string(trainer), trainer_line);
    }
    std::stringstream rest;
    rest << expect.rdbuf();
    const std::string actual = outcome(json, world_size, trainer);
    EXPECT_EQ(rest.str(), actual)
        << "--- " << name << ".expect should end with:\n"
        << actual << "---";
  }
}

TEST(ConfigCorpusTest, EveryFileHasAnExpectation) {
  for (const char* corpus : {kCorpus, kReal}) {
    SCOPED_TRACE(corpus);
    EXPECT_EQ(names_with(corpus, ".json"), names_with(corpus, ".expect"));
  }
  // The corpora as written; a file lost from the data dependency fails
  // here.
  EXPECT_EQ(names_with(kCorpus, ".json").size(), 17u);
  EXPECT_EQ(names_with(kReal, ".json").size(), 60u);
}

TEST(ConfigCorpusTest, EachFileParsesAsExpected) { check_corpus(kCorpus); }

// Each real file's source is listed, and each listed file is there.
TEST(ConfigCorpusTest, EachRealFileHasItsSource) {
  const std::string sources =
      read_file(runfile(std::string(kReal) + "/SOURCES.md"));
  ASSERT_FALSE(sources.empty());
  size_t rows = 0;
  for (const std::string& name : names_with(kReal, ".json")) {
    SCOPED_TRACE(name);
    EXPECT_NE(sources.find("| `" + name + ".json` | https://github.com/"),
              std::string::npos);
    ++rows;
  }
  size_t listed = 0;
  for (size_t at = sources.find("\n| `"); at != std::string::npos;
       at = sources.find("\n| `", at + 1))
    ++listed;
  EXPECT_EQ(listed, rows);
}

TEST(ConfigCorpusTest, EachRealFileParsesAsExpected) { check_corpus(kReal); }

}  // namespace
}  // namespace zerostep
