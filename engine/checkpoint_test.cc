// Checkpoints: a bitwise-identical continuation at every stage (sim and
// gloo), re-partitioning into another world size and stage, and bad
// checkpoints that change nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/gloo_world.h"
#include "common/errors.h"
#include "common/log_capture.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/safetensors.h"
#include "models/task.h"
#include "sim/sim_world.h"

namespace zerostep {
namespace {

std::string temp_dir() { return make_temp_dir("zerostep_ckpt_"); }

Config config_for(int stage, int world) {
  return parse_config(
      "{\"train_micro_batch_size_per_gpu\": 2, "
      "\"managed_gradient_accumulation\": false, "
      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, "
      "\"weight_decay\": 0.01}}, "
      "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
      "{\"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}}, "
      "\"zero_optimization\": {\"stage\": " +
          std::to_string(stage) +
          ", \"stage3_param_persistence_threshold\": 0}}",
      world);
}

MlpWorldOptions trainer_options(uint64_t init_seed) {
  MlpWorldOptions o;
  o.sim_seed = 1;
  o.data_seed = 99;
  o.num_samples = 400;
  o.model_seed = init_seed;
  return o;
}

// A world of `w` engines over the mlp; windows index the data globally so
// that a resumed run sees exactly the batches the uninterrupted one saw.
struct Trainer : MlpWorld {
  Trainer(int w, int stage, uint64_t init_seed, bool gloo = false,
          const std::function<EngineOptions(int)>& options_for = nullptr)
      : MlpWorld(w, config_for(stage, w), trainer_options(init_seed),
                 gloo ? std::make_unique<GlooLocalWorld>(w) : nullptr) {
    make_engines(options_for);
  }
  // Windows [first, first + count), 3 backwards each.
  void train(int first, int count) {
    const int w = world->world_size();
    world->run([&](int r) {
      for (int k = first; k < first + count; ++k) {
        for (int i = 0; i < 3; ++i)
          engines[r]->backward(task->loss(
              *models[r], slice(data, ((k * 3 + i) * 4 + r % 4) * 2 % 390, 2)));
        engines[r]->step();
      }
    });
    (void)w;
  }
  torch::Tensor params() {
    const std::vector<torch::Tensor> out = full_parameters();
    for (size_t r = 1; r < out.size(); ++r)
      EXPECT_TRUE(torch::equal(out[r], out[0]));
    return out[0];
  }
  void save(const std::string& dir, const std::string& tag) {
    world->run([&](int r) { engines[r]->save_checkpoint(dir, tag); });
  }
  void load(const std::string& dir, const std::string& tag = "",
            LoadOptions o = {}) {
    world->run([&](int r) { engines[r]->load_checkpoint(dir, tag, o); });
  }
};

TEST(CheckpointTest, ResumeIsBitwiseIdenticalAtEveryStage) {
  for (int stage : {0, 1, 2, 3}) {
    const std::string dir = temp_dir();
    Trainer a(2, stage, /*init_seed=*/5);
    a.train(0, 2);
    a.save(dir, "k2");
    a.train(2, 3);
    Trainer b(2, stage, /*init_seed=*/77);  // other weights: load replaces
    b.load(dir);
    EXPECT_EQ(b.engines[0]->global_steps(), 2);
    EXPECT_DOUBLE_EQ(b.engines[0]->get_lr(),
                     a.engines[0]->lr_schedule().lr_at(1));
    b.train(2, 3);
    EXPECT_TRUE(torch::equal(a.params(), b.params())) << "stage " << stage;
    EXPECT_EQ(a.engines[1]->global_samples(), b.engines[1]->global_samples());
  }
}

TEST(CheckpointTest, ResumeIsBitwiseIdenticalOnGloo) {
  for (int stage : {0, 1, 2, 3}) {
    const std::string dir = temp_dir();
    Trainer a(2, stage, 5, /*gloo=*/true);
    a.train(0, 2);
    a.save(dir, "k2");
    a.train(2, 2);
    Trainer b(2, stage, 77, /*gloo=*/true);
    b.load(dir);
    b.train(2, 2);
    EXPECT_TRUE(torch::equal(a.params(), b.params())) << "stage " << stage;
  }
}

TEST(CheckpointTest, ReshardsIntoAnotherWorldSizeAndStageOnlyWhenAsked) {
  const std::string dir = temp_dir();
  Trainer a(2, 1, 5);
  a.train(0, 2);
  a.save(dir, "k2");
  const torch::Tensor saved = a.params();
  Trainer b(4, 3, 77);
  const torch::Tensor before = b.params();
  try {
    b.load(dir);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("world size / ZeRO stage 2 / 1"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("allow_reshard"), std::string::npos);
  }
  EXPECT_TRUE(torch::equal(before, b.params()));  // nothing changed
  LoadOptions o;
  o.allow_reshard = true;
  b.load(dir, "", o);
  EXPECT_TRUE(torch::equal(saved, b.params()));
  // And it keeps training from there (4 ranks see other batches than 2,
  // so only the counters and the progress can be compared).
  EXPECT_EQ(b.engines[3]->global_steps(), 2);
  b.train(2, 1);
  EXPECT_EQ(b.engines[3]->global_steps(), 3);
  EXPECT_FALSE(torch::equal(saved, b.params()));
}

TEST(CheckpointTest, WeightsOnlyLoadRestartsTheOptimizer) {
  const std::string dir = temp_dir();
  Trainer a(2, 2, 5);
  a.train(0, 2);
  a.save(dir, "k2");
  // A fresh engine that loads the weights only continues exactly as a fresh
  // engine started from those weights: zero moments, optimizer step 1 next.
  Trainer b(2, 2, 77);
  LoadOptions o;
  o.load_optimizer_states = false;
  b.load(dir, "k2", o);
  EXPECT_TRUE(torch::equal(a.params(), b.params()));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(b.engines[r]->optimizer().step_count(), 0);
    for (float m : b.engines[r]->optimizer().exp_avg()) ASSERT_EQ(m, 0.0f);
  }
  Trainer full(2, 2, 77);
  full.load(dir, "k2");
  EXPECT_GT(full.engines[0]->optimizer().step_count(), 0);
  b.train(2, 1);
  full.train(2, 1);
  // Same gradients, different optimizer state: different updates.
  EXPECT_FALSE(torch::equal(b.params(), full.params()));
}

TEST(CheckpointTest, CorruptOrTruncatedFilesAreIoErrorsThatChangeNothing) {
  const std::string dir = temp_dir();
  Trainer a(2, 2, 5);
  a.train(0, 1);
  a.save(dir, "t");
  const std::string file = dir + "/t/rank_1.bin";
  std::string bytes = read_file(file);
  Trainer b(2, 2, 77);
  const torch::Tensor before = b.params();
  // One flipped bit.
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 1;
  atomic_write_file(file, flipped);
  try {
    b.load(dir);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_1.bin"), std::string::npos)
        << e.what();
  }
  // Truncated.
  atomic_write_file(file, bytes.substr(0, bytes.size() - 100));
  EXPECT_THROW(b.load(dir), IoError);
  EXPECT_TRUE(torch::equal(before, b.params()));
  EXPECT_EQ(b.engines[0]->global_steps(), 0);
  // A missing checkpoint names the path.
  try {
    b.load(dir + "/nope");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nope/latest"), std::string::npos);
  }
}

// Everything an engine's state could change by, to compare bitwise.
struct Snapshot {
  torch::Tensor params;
  std::vector<std::vector<float>> exp_avg;
  std::vector<int64_t> counters;  // per rank: micro, global, samples, skipped,
                                  // optimizer steps
  std::vector<double> lr;
};

Snapshot snapshot(Trainer& t) {
  Snapshot s;
  s.params = t.params();
  for (auto& e : t.engines) {
    s.exp_avg.push_back(e->optimizer().exp_avg());
    s.counters.insert(s.counters.end(),
                      {e->micro_steps(), e->global_steps(), e->global_samples(),
                       e->skipped_steps(), e->optimizer().step_count()});
    s.lr.push_back(e->get_lr());
  }
  return s;
}

bool matches(const Snapshot& a, const Snapshot& b) {
  return same_bits(a.params, b.params) && a.exp_avg == b.exp_avg &&
         a.counters == b.counters && a.lr == b.lr;
}

void expect_same(const Snapshot& a, const Snapshot& b, const std::string& why) {
  EXPECT_TRUE(same_bits(a.params, b.params)) << why;
  EXPECT_EQ(a.exp_avg, b.exp_avg) << why;
  EXPECT_EQ(a.counters, b.counters) << why;
  EXPECT_EQ(a.lr, b.lr) << why;
}

// "/counters/global_steps" -> "counters.global_steps", "/files/0/name" ->
// "files[0].name": how load's errors name a field.
std::string field_name(const std::string& pointer) {
  std::string out;
  std::stringstream ss(pointer.substr(1));
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (!part.empty() && std::isdigit(static_cast<unsigned char>(part[0])))
      out += "[" + part + "]";
    else
      out += (out.empty() ? "" : ".") + part;
  }
  return out;
}

// `manifest` with "manifest_fnv1a" recomputed, as a writer would.
nlohmann::json with_checksum(nlohmann::json manifest) {
  manifest.erase("manifest_fnv1a");
  manifest["manifest_fnv1a"] = manifest_checksum(manifest.dump());
  return manifest;
}

// The checksum makes every edit of every value an error naming the
// manifest; a manifest whose checksum was recomputed after the edit is
// still rejected, naming the field, when the value is out of range. The
// engine is unchanged bitwise either way.
TEST(CheckpointTest, AnOlderManifestWithoutChecksumLoadsWithAWarning) {
  const std::string dir = temp_dir();
  Trainer a(2, 1, 5);
  a.train(0, 2);
  a.save(dir, "t");
  const std::string path = dir + "/t/manifest.json";
  nlohmann::json m = nlohmann::json::parse(read_file(path));
  ASSERT_EQ(m["format"], kCheckpointFormat);
  // zerostep-checkpoint-1: the same fields, no checksum of its own.
  m.erase("manifest_fnv1a");
  m["format"] = kCheckpointFormatV1;
  atomic_write_file(path, m.dump(1));
  LogCapture log;
  Trainer b(2, 1, 77);
  b.world->run([&](int r) { b.engines[r]->load_checkpoint(dir, "t"); });
  const std::vector<std::string> warnings = log.at(LogLevel::kWarning);
  expect_same(snapshot(a), snapshot(b), "v1 manifest");
  ASSERT_EQ(warnings.size(), 2u);  // every rank reads the manifest
  EXPECT_NE(warnings[0].find("has format zerostep-checkpoint-1 (no checksum "
                             "of its own)"),
            std::string::npos)
      << warnings[0];
  // A current manifest without its checksum is refused, naming the field.
  m["format"] = kCheckpointFormat;
  atomic_write_file(path, m.dump(1));
  auto errors = b.world->run_collect(
      [&](int r) { b.engines[r]->load_checkpoint(dir, "t"); });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'manifest_fnv1a'"),
              std::string::npos)
        << e.what();
  }
}

TEST(CheckpointTest, AnFp32CheckpointLoadsIntoBf16AndFp16EnginesAndSaysSo) {
  const std::string dir = temp_dir();
  Trainer a(2, 2, 5);
  a.train(0, 2);
  a.save(dir, "t");
  for (const char* section : {"bf16", "fp16"}) {
    Config c = config_for(2, 2);
    Config mixed =
        parse_config(std::string("{\"train_micro_batch_size_per_gpu\": 2, "
                                 "\"managed_gradient_accumulation\": false, "
                                 "\"zero_optimization\": {\"stage\": 2}, \"") +
                         section + "\": {\"enabled\": true}}",
                     2);
    mixed.optimizer = c.optimizer;
    mixed.scheduler = c.scheduler;
    MlpWorld b(2, mixed, trainer_options(77));
    b.make_engines();
    LogCapture log;
    b.world->run([&](int r) { b.engines[r]->load_checkpoint(dir, "t"); });
    const std::vector<LogCapture::Line> logged = log.lines();
    // The float32 master weights are the checkpoint's, bit for bit (under
    // bf16 full_parameters() gathers the partitioned master: a collective).
    std::vector<torch::Tensor> full(2);
    b.world->run([&](int r) { full[r] = b.engines[r]->full_parameters(); });
    EXPECT_TRUE(torch::equal(full[0], a.engines[0]->full_parameters()))
        << section;
    EXPECT_TRUE(torch::equal(full[1], full[0])) << section;
    ASSERT_EQ(logged.size(), 1u) << section;  // rank 0, once
    EXPECT_EQ(logged[0].first, LogLevel::kInfo);
    EXPECT_NE(logged[0].second.find("was written by a fp32 engine and loads "
                                    "into this " +
                                    std::string(section) + " engine"),
              std::string::npos)
        << logged[0].second;
  }
}

TEST(CheckpointTest, EveryManifestFieldIsVerifiedBeforeAnythingChanges) {
  const std::string dir = temp_dir();
  Trainer a(2, 2, 5);
  a.train(0, 2);
  a.save(dir, "t");
  const std::string path = dir + "/t/manifest.json";
  const std::string original = read_file(path);
  const nlohmann::json manifest = nlohmann::json::parse(original);
  Trainer b(2, 2, 77);
  b.train(0, 1);
  const Snapshot before = snapshot(b);
  auto expect_rejected = [&](const nlohmann::json& edited,
                             const std::string& expect,
                             const std::string& why) {
    atomic_write_file(path, edited.dump(1));
    auto errors = b.world->run_collect(
        [&](int r) { b.engines[r]->load_checkpoint(dir, "t"); });
    for (const auto& e : errors) {
      ASSERT_TRUE(e) << why << ": loaded";
      try {
        std::rethrow_exception(e);
      } catch (const IoError& err) {
        const std::string what = err.what();
        EXPECT_NE(what.find(path), std::string::npos) << why << ": " << what;
        EXPECT_NE(what.find("field '" + expect + "'"), std::string::npos)
            << why << ": " << what;
      } catch (const std::exception& err) {
        ADD_FAILURE() << why << ": not an IoError: " << err.what();
      }
    }
    expect_same(before, snapshot(b), why);
  };
  const nlohmann::json flat = manifest.flatten();
  ASSERT_GT(flat.size(), 20u);
  for (const auto& item : flat.items()) {
    const nlohmann::json::json_pointer at(item.key());
    const nlohmann::json& value = item.value();
    // A plausible edit, checksum left as it was.
    nlohmann::json edited = manifest;
    if (value.is_string())
      edited[at] = value.get<std::string>() + "x";
    else if (value.is_number_float())
      edited[at] = value.get<double>() * 2;
    else
      edited[at] = value.get<int64_t>() + 1;
    expect_rejected(edited, "manifest_fnv1a", "edit of " + item.key());
    if (item.key() == "/manifest_fnv1a") continue;
    // An impossible value under a recomputed checksum.
    edited = manifest;
    edited[at] =
        value.is_string() ? nlohmann::json("bogus") : nlohmann::json(-5);
    expect_rejected(with_checksum(edited), field_name(item.key()),
                    "impossible " + item.key());
  }
  // Values that contradict each other, checksum recomputed.
  auto with = [&](const std::string& key, int64_t v) {
    nlohmann::json e = manifest;
    e[nlohmann::json::json_pointer(key)] = v;
    return with_checksum(e);
  };
  const int64_t steps = manifest["counters"]["global_steps"].get<int64_t>();
  expect_rejected(with("/counters/global_steps", steps + 1),
                  "lr_schedule_iteration", "global_steps + 1");
  expect_rejected(with("/lr_schedule_iteration", steps),
                  "lr_schedule_iteration", "lr_schedule_iteration + 1");
  expect_rejected(with("/optimizer_steps", steps + 1), "optimizer_steps",
                  "optimizer_steps above global_steps");
  expect_rejected(with("/counters/micro_steps", steps - 1),
                  "counters.micro_steps", "micro_steps below global_steps");
  // The untouched manifest still loads.
  atomic_write_file(path, original);
  b.load(dir, "t");
  EXPECT_TRUE(same_bits(a.params(), b.params()));
}

// The real file system, stopped before operation number `crash_at` (from
// 0) as a crash would stop it: the operations before it happened, none
// after (an injected IoError, so the other ranks learn of it as of a
// failed write).
class CrashingFiles final : public CheckpointFiles {
 public:
  int64_t operations = 0;
  int64_t crash_at = -1;  // -1: never

  void write(const std::string& path, const std::string& bytes) override {
    next();
    base().write(path, bytes);
  }
  void sync_file(const std::string& path) override {
    next();
    base().sync_file(path);
  }
  void sync_folder(const std::string& path) override {
    next();
    base().sync_folder(path);
  }
  void rename(const std::string& from, const std::string& to) override {
    next();
    base().rename(from, to);
  }
  void make_folder(const std::string& path) override {
    next();
    base().make_folder(path);
  }
  void remove_file(const std::string& path) override {
    next();
    base().remove_file(path);
  }
  void remove_folder(const std::string& path) override {
    next();
    base().remove_folder(path);
  }

 private:
  static CheckpointFiles& base() { return posix_checkpoint_files(); }
  void next() {
    if (operations++ == crash_at)
      throw IoError("injected crash before operation " +
                    std::to_string(crash_at));
  }
};

// Note [Checkpoint switch]: a save stopped after any of its operations, on
// any rank, leaves `latest` naming a checkpoint that loads the old or the
// new state bitwise, and <tag> loading one of them too; the next save
// under the tag recovers and completes. Both for a re-save under the same
// tag and for a save under a new one.
TEST(CheckpointTest, ACrashAtAnyPointOfASaveLeavesTheOldOrTheNewCheckpoint) {
  std::vector<CrashingFiles> files(2);
  Trainer old_state(2, 1, 5);
  old_state.train(0, 1);
  Trainer next(2, 1, 5, /*gloo=*/false, [&](int r) {
    EngineOptions o;
    o.checkpoint_files = &files[r];
    return o;
  });
  next.train(0, 2);
  const Snapshot old_snap = snapshot(old_state), new_snap = snapshot(next);
  ASSERT_FALSE(matches(old_snap, new_snap));
  Trainer loader(2, 1, 77);
  auto loads = [&](const std::string& dir, const std::string& tag) {
    auto errors = loader.world->run_collect(
        [&](int r) { loader.engines[r]->load_checkpoint(dir, tag); });
    for (const auto& e : errors)
      if (e) return false;
    return true;
  };
  for (const std::string tag : {"t", "u"}) {
    // How many operations each rank's save makes when it replaces "t".
    std::vector<int64_t> total(2);
    {
      const std::string dir = temp_dir();
      old_state.save(dir, "t");
      for (auto& f : files) f.operations = 0;
      next.save(dir, tag);
      for (int r = 0; r < 2; ++r) total[r] = files[r].operations;
      remove_tree(posix_checkpoint_files(), dir);
    }
    EXPECT_GE(total[0], tag == "t" ? 20 : 14);
    EXPECT_EQ(total[1], 4);  // its file: write, fsync, rename, fsync folder
    for (int r = 0; r < 2; ++r) {
      for (int64_t k = 0; k <= total[r]; ++k) {
        const std::string at = "tag " + tag + ", rank " + std::to_string(r) +
                               ", operation " + std::to_string(k) + " of " +
                               std::to_string(total[r]);
        const std::string dir = temp_dir();
        old_state.save(dir, "t");
        for (auto& f : files) f.operations = 0;
        files[r].crash_at = k;
        auto errors = next.world->run_collect(
            [&](int q) { next.engines[q]->save_checkpoint(dir, tag); });
        files[r].crash_at = -1;
        for (const auto& e : errors) {
          if (k == total[r]) {
            EXPECT_FALSE(e) << at;
          } else {
            ASSERT_TRUE(e) << at;
            EXPECT_THROW(std::rethrow_exception(e), IoError) << at;
          }
        }
        // `latest` names a loadable checkpoint: the old or the new one.
        ASSERT_TRUE(loads(dir, "")) << at;
        const Snapshot latest = snapshot(loader);
        EXPECT_TRUE(matches(latest, old_snap) || matches(latest, new_snap))
            << at;
        if (k == total[r]) {
          EXPECT_TRUE(matches(latest, new_snap)) << at;
        }
        // "t" always loads, old or new; a new tag loads the new state or
        // is not there yet.
        ASSERT_TRUE(loads(dir, "t")) << at;
        const Snapshot t = snapshot(loader);
        if (tag == "t") {
          EXPECT_TRUE(matches(t, old_snap) || matches(t, new_snap)) << at;
        } else {
          EXPECT_TRUE(matches(t, old_snap)) << at;
        }
        if (tag == "u" && loads(dir, "u")) {
          EXPECT_TRUE(matches(snapshot(loader), new_snap)) << at;
        }
        // The next save recovers and completes, leaving nothing aside.
        next.save(dir, tag);
        ASSERT_TRUE(loads(dir, "")) << at;
        EXPECT_TRUE(matches(snapshot(loader), new_snap)) << at;
        EXPECT_FALSE(path_exists(staging_folder(dir, tag))) << at;
        EXPECT_FALSE(path_exists(backup_folder(dir, tag))) << at;
        remove_tree(posix_checkpoint_files(), dir);
      }
    }
  }
}

// A load of <tag> that finds only what an interrupted save left: the old
// checkpoint renamed aside, or a complete staging folder.
TEST(CheckpointTest, LoadFindsACheckpointCaughtBetweenRenames) {
  const std::string dir = temp_dir();
  Trainer a(2, 1, 5);
  a.train(0, 1);
  a.save(dir, "t");
  const torch::Tensor saved = a.params();
  CheckpointFiles& files = posix_checkpoint_files();
  files.rename(dir + "/t", backup_folder(dir, "t"));
  Trainer b(2, 1, 77);
  b.load(dir);
  EXPECT_TRUE(same_bits(saved, b.params()));
  files.rename(backup_folder(dir, "t"), staging_folder(dir, "t"));
  Trainer c(2, 1, 77);
  c.load(dir, "t");
  EXPECT_TRUE(same_bits(saved, c.params()));
}

TEST(CheckpointTest, TagsStartingWithADotAreRejected) {
  const std::string dir = temp_dir();
  Trainer a(1, 0, 5);
  EXPECT_THROW(a.engines[0]->save_checkpoint(dir, ".t.tmp"), UsageError);
}

TEST(CheckpointTest, AnotherModelIsRejected) {
  const std::string dir = temp_dir();
  Trainer a(1, 0, 5);
  a.save(dir, "t");
  SimWorld world({1, 1});
  auto task = make_task("mlp", /*scale=*/2);
  auto model = task->make_model(1);
  world.run([&](int r) {
    Engine e(model, config_for(0, 1), &world.comm(r));
    try {
      e.load_checkpoint(dir);
      FAIL();
    } catch (const UsageError& err) {
      const std::string what = err.what();
      EXPECT_NE(what.find("Load it into the same model"), std::string::npos)
          << what;
      // The mlp at twice the width differs from its first weight on.
      EXPECT_NE(what.find("the first difference: parameter 0 ('"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("elements in the checkpoint"), std::string::npos)
          << what;
    }
  });
}

TEST(CheckpointTest, SavingInsideAnOpenWindowIsRejectedOnEveryRank) {
  const std::string dir = temp_dir();
  Trainer a(2, 1, 5);
  auto errors = a.world->run_collect([&](int r) {
    a.engines[r]->backward(a.task->loss(*a.models[r], slice(a.data, 0, 2)));
    a.engines[r]->save_checkpoint(dir, "t");
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), UsageError);
  }
  EXPECT_NE(access((dir + "/t").c_str(), F_OK), 0);  // nothing written
}

// Manifest last, then `latest`: a crash after the rank files of a new
// checkpoint but before its manifest leaves the previous one current.
TEST(CheckpointTest, ACrashBeforeTheManifestLeavesThePreviousCheckpoint) {
  const std::string dir = temp_dir();
  Trainer a(2, 1, 5);
  a.train(0, 1);
  a.save(dir, "one");
  const torch::Tensor at_one = a.params();
  a.train(1, 1);
  a.save(dir, "two");
  // The state a crash between the rank files and the manifest leaves.
  std::remove((dir + "/two/manifest.json").c_str());
  atomic_write_file(dir + "/latest", "one\n");
  Trainer b(2, 1, 77);
  b.load(dir);
  EXPECT_TRUE(torch::equal(at_one, b.params()));
  EXPECT_THROW(b.load(dir, "two"), IoError);  // not a checkpoint
}

// The trainable parameters' names and shapes, in registration order.
std::vector<std::pair<std::string, std::vector<uint64_t>>> trainable(
    torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::vector<uint64_t>>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    std::vector<uint64_t> shape;
    for (int64_t d : item.value().sizes()) shape.push_back(d);
    out.emplace_back(item.key(), shape);
  }
  return out;
}

// The message of the error `run` throws on every rank (EXPECTs each is an
// E); "" if a rank threw none.
template <typename E>
std::string error_on_every_rank(LocalWorld& world,
                                const std::function<void(int)>& run) {
  std::string message;
  for (const auto& e : world.run_collect(run)) {
    if (!e) return "";
    try {
      std::rethrow_exception(e);
    } catch (const E& error) {
      message = error.what();
    } catch (...) {
      ADD_FAILURE() << "another error type";
    }
  }
  return message;
}

TEST(CheckpointTest, ExportIsSafetensorsNamedAsTheModelNamesItsParameters) {
  const std::string dir = temp_dir();
  Trainer a(2, 3, 5);
  a.train(0, 1);
  a.world->run(
      [&](int r) { a.engines[r]->export_full_model(dir + "/m.safetensors"); });
  const torch::Tensor p = a.params();
  const SafetensorsFile f = decode_safetensors(
      read_file(dir + "/m.safetensors"), dir + "/m.safetensors");
  const auto expected = trainable(*a.models[0]);
  ASSERT_EQ(f.tensors.size(), expected.size());
  std::string data;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(f.tensors[i].name, expected[i].first);
    EXPECT_EQ(f.tensors[i].shape, expected[i].second);
    EXPECT_EQ(f.tensors[i].dtype, "F32");
    data += f.tensors[i].data;
  }
  EXPECT_EQ(expected[0].first, "layer0.fc.weight");
  ASSERT_EQ(data.size(), p.numel() * sizeof(float));
  EXPECT_EQ(std::memcmp(data.data(), p.data_ptr<float>(), data.size()), 0);
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

// Bitwise: the values are copied, never computed. At every stage, into
// the export's world size and another, the imported engine's parameters
// are the exported ones, and training on from them is the same run as
// training on in the engine that exported them (fresh optimizers both),
// so stage 3's partitions follow the load.
TEST(CheckpointTest, LoadModelWeightsRestoresAnExportAtEveryStageAndWorld) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string path = temp_dir() + "/m.safetensors";
    Trainer a(2, stage, 5);
    a.world->run([&](int r) { a.engines[r]->export_full_model(path); });
    for (int w : {2, 3}) {
      SCOPED_TRACE("world " + std::to_string(w));
      Trainer b(w, stage, 77);
      ASSERT_FALSE(same_bits(b.params(), a.params()));
      b.world->run([&](int r) { b.engines[r]->load_model_weights(path); });
      EXPECT_TRUE(same_bits(b.params(), a.params()));
      if (w != 2) continue;
      a.train(0, 2);
      b.train(0, 2);
      EXPECT_TRUE(same_bits(b.params(), a.params()));
      a.world->run([&](int r) { a.engines[r]->load_model_weights(path); });
    }
  }
}

TEST(CheckpointTest, LoadModelWeightsLeavesOptimizerStateAndCounters) {
  const std::string path = temp_dir() + "/m.safetensors";
  Trainer a(2, 2, 5);
  a.world->run([&](int r) { a.engines[r]->export_full_model(path); });
  Trainer b(2, 2, 77);
  b.train(0, 2);
  const std::vector<float> exp_avg = b.engines[1]->optimizer().exp_avg();
  const int64_t steps = b.engines[1]->optimizer().step_count();
  const int64_t global_steps = b.engines[1]->global_steps();
  b.world->run([&](int r) { b.engines[r]->load_model_weights(path); });
  EXPECT_TRUE(same_bits(b.params(), a.params()));
  EXPECT_TRUE(same_bits(b.engines[1]->optimizer().exp_avg(), exp_avg));
  EXPECT_EQ(b.engines[1]->optimizer().step_count(), steps);
  EXPECT_EQ(b.engines[1]->global_steps(), global_steps);
}

TEST(CheckpointTest, ABf16ExportLoadsAsTheBf16RoundedValues) {
  for (int stage : {0, 3}) {
    const std::string path = temp_dir() + "/m.safetensors";
    Trainer a(2, stage, 5);
    a.train(0, 1);
    ExportOptions options;
    options.dtype = ExportOptions::Dtype::kBF16;
    a.world->run(
        [&](int r) { a.engines[r]->export_full_model(path, options); });
    const SafetensorsFile f = decode_safetensors(read_file(path), path);
    for (const SafetensorsTensor& t : f.tensors) EXPECT_EQ(t.dtype, "BF16");
    Trainer b(3, stage, 77);
    b.world->run([&](int r) { b.engines[r]->load_model_weights(path); });
    const torch::Tensor rounded =
        a.params().to(torch::kBFloat16).to(torch::kFloat32);
    EXPECT_FALSE(same_bits(rounded, a.params()));
    EXPECT_TRUE(same_bits(b.params(), rounded)) << "stage " << stage;
  }
}

TEST(CheckpointTest, AFileThatDoesNotFitNamesEveryMismatchAndChangesNothing) {
  const std::string dir = temp_dir();
  Trainer a(2, 3, 5);
  a.world->run(
      [&](int r) { a.engines[r]->export_full_model(dir + "/m.safetensors"); });
  SafetensorsFile f = decode_safetensors(read_file(dir + "/m.safetensors"),
                                         dir + "/m.safetensors");
  ASSERT_GE(f.tensors.size(), 4u);
  const std::string missing = f.tensors[0].name;
  const std::string renamed = f.tensors[1].name;
  const std::string reshaped = f.tensors[2].name;
  const std::string halved = f.tensors[3].name;
  f.tensors.erase(f.tensors.begin());       // missing
  f.tensors[0].name = "encoder.not_there";  // missing + unexpected
  std::reverse(f.tensors[1].shape.begin(), f.tensors[1].shape.end());
  f.tensors[1].shape.push_back(1);  // wrong shape
  f.tensors[2].dtype = "F16";       // a dtype that does not load
  f.tensors[2].data.resize(f.tensors[2].data.size() / 2);
  f.tensors.push_back({"extra", "F32", {1}, std::string(4, '\0')});
  atomic_write_file(dir + "/bad.safetensors",
                    encode_safetensors(f, "bad.safetensors"));
  Trainer b(2, 3, 77);
  const torch::Tensor before = b.params();
  const std::string message =
      error_on_every_rank<UsageError>(*b.world, [&](int r) {
        b.engines[r]->load_model_weights(dir + "/bad.safetensors");
      });
  for (const std::string& part :
       {std::string("6 mismatches"), "parameter '" + missing + "' (shape",
        "parameter '" + renamed + "' (shape",
        "tensor '" + reshaped + "' has shape", "tensor '" + halved + "' is F16",
        std::string("tensor 'extra' is not a parameter"),
        std::string("tensor 'encoder.not_there' is not a parameter"),
        std::string("Nothing was changed")})
    EXPECT_NE(message.find(part), std::string::npos)
        << "'" << part << "' not in: " << message;
  EXPECT_TRUE(same_bits(b.params(), before));

  // A malformed file, the former export format, and an open window.
  std::string bytes = read_file(dir + "/m.safetensors");
  atomic_write_file(dir + "/short.safetensors",
                    bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(error_on_every_rank<IoError>(*b.world,
                                         [&](int r) {
                                           b.engines[r]->load_model_weights(
                                               dir + "/short.safetensors");
                                         })
                .find("beyond its"),
            std::string::npos);
  atomic_write_file(dir + "/old.bin", "ZSMODEL1" + std::string(8, '\0'));
  EXPECT_NE(
      error_on_every_rank<IoError>(
          *b.world,
          [&](int r) { b.engines[r]->load_model_weights(dir + "/old.bin"); })
          .find("former export format (ZSMODEL1)"),
      std::string::npos);
  EXPECT_NE(error_on_every_rank<UsageError>(
                *b.world,
                [&](int r) {
                  b.engines[r]->backward(
                      b.task->loss(*b.models[r], slice(b.data, 0, 2)));
                  b.engines[r]->load_model_weights(dir + "/m.safetensors");
                })
                .find("open accumulation window"),
            std::string::npos);
  EXPECT_TRUE(same_bits(b.params(), before));
}

TEST(CheckpointTest, AnExportThatCannotBeWrittenFailsOnEveryRank) {
  Trainer a(2, 1, 5);
  EXPECT_NE(error_on_every_rank<IoError>(*a.world,
                                         [&](int r) {
                                           a.engines[r]->export_full_model(
                                               "/nonexistent/dir/m.st");
                                         })
                .find("export_full_model('/nonexistent/dir/m.st') failed"),
            std::string::npos);
}

}  // namespace
}  // namespace zerostep
