// The trainer server's ds_config: its own requirements filled in, and a
// Hugging Face template's "auto" filled with the server's trainer values
// (Note [Trainer values] in config/trainer_values.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "tools/tinker/trainer.h"

namespace zerostep {
namespace tinker {
namespace {

// The Trainer's ZeRO-2 template (as in accelerate's and transformers' own).
const char* const kTemplate = R"({
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                "eps": "auto", "weight_decay": "auto"}},
  "zero_optimization": {"stage": 2, "overlap_comm": true,
                        "reduce_bucket_size": "auto"},
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto"
})";

TEST(ServerConfigTest, AutoTakesTheServersValues) {
  const Config c = server_config(kTemplate, 3);
  EXPECT_FALSE(c.managed_gradient_accumulation);
  EXPECT_EQ(c.gradient_accumulation_scaling, GradAccumScaling::kNone);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 3);
  EXPECT_EQ(c.optimizer.lr, 1e-4);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-12);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.precision.dtype, Precision::kFp32);
  int64_t hidden = 0;
  for (const BaseModel& b : base_models()) hidden = std::max(hidden, b.d_model);
  EXPECT_EQ(c.zero.reduce_bucket_size, hidden * hidden);
  EXPECT_EQ(c.filled_auto.size(), 10u);
  // A file without "auto" fills nothing.
  EXPECT_TRUE(server_config(R"({"zero_optimization": {"stage": 1}})", 2)
                  .filled_auto.empty());
}

// The server knows no run length: a schedule's "auto" steps name the field.
TEST(ServerConfigTest, AnAutoTheServerCannotFillNamesTheField) {
  try {
    server_config(R"({"scheduler": {"type": "WarmupDecayLR", "params": {
                        "total_num_steps": "auto", "warmup_num_steps": 10}}})",
                  1);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.problems()[0].key, "scheduler.params.total_num_steps");
    EXPECT_NE(e.problems()[0].fix.find("set TrainerValues::total_steps"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
