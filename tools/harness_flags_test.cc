#include "tools/harness_flags.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace zerostep {
namespace {

HarnessFlags parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv = {"harness"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parse_harness_flags(static_cast<int>(argv.size()), argv.data());
}

// The message of the FlagError parsing `args` throws ("" if none).
std::string error_of(std::initializer_list<const char*> args) {
  try {
    parse(args);
  } catch (const FlagError& e) {
    return e.what();
  }
  return "";
}

TEST(HarnessFlagsTest, OnlyMatrixFreeFlagsKeepTheDefaultPlan) {
  EXPECT_TRUE(parse({}).default_matrix);
  EXPECT_TRUE(parse({"--json", "--seed=7", "--threads=2", "--model=gpt",
                     "--model-scale=2", "--backend=gloo", "--device=cuda",
                     "--nvme-path=/x", "--managed=both"})
                  .default_matrix);
  for (const char* flag :
       {"--stages=1", "--world=2", "--backwards=3", "--steps=2",
        "--scaling=none", "--clip=1", "--dtype=bf16", "--offload=cpu",
        "--offload-param", "--overlap-comm", "--micro-batch=3",
        "--reduce-bucket-size=8", "--allgather-bucket-size=8",
        "--persistence-threshold=0", "--sub-group-size=4", "--config=f.json"})
    EXPECT_FALSE(parse({flag}).default_matrix) << flag;
}

TEST(HarnessFlagsTest, GivenFlagsAreTold) {
  const HarnessFlags none = parse({});
  EXPECT_FALSE(none.stages_given || none.dtypes_given || none.offloads_given ||
               none.clip_given);
  const HarnessFlags all =
      parse({"--stages=2", "--dtype=fp16", "--offload=none", "--clip=0"});
  EXPECT_TRUE(all.stages_given && all.dtypes_given && all.offloads_given &&
              all.clip_given);
}

TEST(HarnessFlagsTest, OverflowWithAConfigFileLeavesTheDtypeToTheFile) {
  // The file may train in fp16: the harness checks once it has read it.
  EXPECT_EQ(error_of({"--config=f.json", "--overflow=0:0:0"}), "");
  EXPECT_NE(error_of({"--config=f.json", "--dtype=bf16", "--overflow=0:0:0"})
                .find("--overflow needs fp16"),
            std::string::npos);
}

TEST(HarnessFlagsTest, DefaultsAreTheParityMatrix) {
  const HarnessFlags f = parse({});
  EXPECT_FALSE(f.help);
  EXPECT_EQ(f.mode, HarnessMode::kParity);
  EXPECT_EQ(f.stages, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(f.worlds, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(f.per_step, (std::vector<int>{4, 4, 4}));
  EXPECT_EQ(f.scalings.size(), 3u);
  EXPECT_EQ(f.dtypes, (std::vector<Precision>{Precision::kFp32}));
  EXPECT_EQ(f.offloads, (std::vector<OffloadDevice>{OffloadDevice::kNone}));
  EXPECT_EQ(f.managed_modes, (std::vector<bool>{false, true}));
  EXPECT_EQ(f.model, "mlp");
  EXPECT_EQ(f.backend, "sim");
  EXPECT_EQ(f.micro_batch, 2);
  EXPECT_EQ(f.seed, 1u);
  EXPECT_EQ(f.persistence_threshold, -1);
}

TEST(HarnessFlagsTest, ListsAndValues) {
  const HarnessFlags f =
      parse({"--json", "--stages=0,1", "--world=2,4", "--backwards=2,5,3",
             "--scaling=per_step_count", "--dtype=fp32,fp16",
             "--overflow=1:1:3", "--offload=cpu,nvme", "--offload-param",
             "--seed=7", "--reduce-bucket-size=4096"});
  EXPECT_TRUE(f.json);
  EXPECT_EQ(f.stages, (std::vector<int>{0, 1}));
  EXPECT_EQ(f.per_step, (std::vector<int>{2, 5, 3}));
  EXPECT_EQ(f.scalings,
            (std::vector<GradAccumScaling>{GradAccumScaling::kPerStepCount}));
  EXPECT_EQ(f.dtypes,
            (std::vector<Precision>{Precision::kFp32, Precision::kFp16}));
  EXPECT_EQ(f.overflow, (std::vector<int>{1, 1, 3}));
  EXPECT_FALSE(f.overflow_element);  // W:R:B alone: the whole loss
  EXPECT_EQ(f.offloads, (std::vector<OffloadDevice>{OffloadDevice::kCpu,
                                                    OffloadDevice::kNvme}));
  EXPECT_TRUE(f.offload_param);
  EXPECT_EQ(f.seed, 7u);
  EXPECT_EQ(f.reduce_bucket_size, 4096);
}

TEST(HarnessFlagsTest, OneBackwardsValueRepeatsForEveryStep) {
  EXPECT_EQ(parse({"--backwards=2", "--steps=5"}).per_step,
            (std::vector<int>{2, 2, 2, 2, 2}));
}

TEST(HarnessFlagsTest, ModesFromFaultsSwarmAndScale) {
  const HarnessFlags faults = parse({"--faults=crash:2@7", "--managed=true"});
  EXPECT_EQ(faults.mode, HarnessMode::kFaults);
  EXPECT_EQ(faults.faults, "crash:2@7");
  EXPECT_EQ(faults.managed_modes, (std::vector<bool>{true}));
  EXPECT_EQ(parse({"--faults="}).mode, HarnessMode::kFaults);  // given, empty
  EXPECT_EQ(parse({"--swarm=3"}).mode, HarnessMode::kSwarm);
  EXPECT_EQ(parse({"--swarm=0"}).mode, HarnessMode::kParity);

  const HarnessFlags scale =
      parse({"--simulate-scale", "--backwards=2,9", "--seq-len=1000",
             "--micro-batch=3", "--overlap-comm", "--alpha=1e-6"});
  EXPECT_EQ(scale.mode, HarnessMode::kScale);
  EXPECT_EQ(scale.scale.schedule.backwards, 2);
  EXPECT_TRUE(scale.scale.schedule.overlap_comm);
  EXPECT_EQ(scale.scale.tokens_per_micro_batch, 3000.0);
  EXPECT_EQ(scale.scale.cost.alpha_s, 1e-6);
  EXPECT_EQ(scale.managed_modes, (std::vector<bool>{false}));  // both → one
  EXPECT_TRUE(scale.per_step.empty());  // scale mode has no steps
  EXPECT_EQ(parse({"--simulate-scale"}).scale.tokens_per_micro_batch,
            kPresetSequenceLength);  // one sample per micro-batch
  EXPECT_EQ(parse({"--simulate-scale"}).scale.schedule.max_reuse_distance,
            1000000000);  // DeepSpeed's default
  EXPECT_EQ(parse({"--simulate-scale", "--max-reuse-distance=0"})
                .scale.schedule.max_reuse_distance,
            0);
  EXPECT_FALSE(parse({"--simulate-scale"}).scale.schedule.gather_once_per_step);
  EXPECT_TRUE(parse({"--simulate-scale", "--gather-once-per-step"})
                  .scale.schedule.gather_once_per_step);
  const HarnessFlags parity = parse({"--gather-once-per-step"});
  EXPECT_TRUE(parity.gather_once_per_step);
  EXPECT_FALSE(parity.default_matrix);  // a matrix flag
}

TEST(HarnessFlagsTest, HelpStopsParsing) {
  EXPECT_TRUE(parse({"--stages=1", "--help", "--nonsense=1"}).help);
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_EQ(error_of({"--nonsense=1", "--help"}), "unknown flag --nonsense");
}

// Numbers are read whole and checked for range: strtol, strtoull and the
// casts after them read these as other values (a wrapped world of
// 1215752191, a bucket size of -1, a micro-batch of 2, a clip of NaN).
TEST(HarnessFlagsTest, NumbersThatAreNotTheirOwnValueAreErrors) {
  EXPECT_EQ(error_of({"--world=99999999999"}),
            "--world=99999999999: '99999999999' is out of range (at most "
            "2147483647)");
  EXPECT_EQ(error_of({"--world=2,99999999999999999999"}),
            "--world=2,99999999999999999999: '99999999999999999999' is out of "
            "range (at most 2147483647)");
  EXPECT_EQ(error_of({"--world=+2"}), "--world=+2: '+2' is not an integer");
  EXPECT_EQ(error_of({"--micro-batch=2,3"}),
            "--micro-batch=2,3: takes one integer, not a list");
  EXPECT_EQ(error_of({"--reduce-bucket-size=18446744073709551615"}),
            "--reduce-bucket-size=18446744073709551615: out of range (at most "
            "9223372036854775807)");
  EXPECT_EQ(error_of({"--reduce-bucket-size=1e6"}),
            "--reduce-bucket-size=1e6: not a non-negative integer");
  EXPECT_EQ(error_of({"--clip=nan"}), "--clip=nan: not a number");
  EXPECT_EQ(error_of({"--alpha=inf"}), "--alpha=inf: not a number");
  EXPECT_EQ(error_of({"--clip=1.0x"}), "--clip=1.0x: not a number");
  EXPECT_EQ(error_of({"--ranks-per-node=2.5"}),
            "--ranks-per-node=2.5: '2.5' is not an integer");
  EXPECT_EQ(error_of({"--ranks-per-node=0"}),
            "--ranks-per-node=0: must be >= 1");
  EXPECT_EQ(error_of({"--overflow=1:99999999999:2"}),
            "--overflow=1:99999999999:2: '99999999999' is not an integer");
  // The whole range of a seed is still a seed.
  EXPECT_EQ(parse({"--seed=18446744073709551615"}).seed,
            18446744073709551615ull);
}

TEST(HarnessFlagsTest, ErrorsNameTheFlagAndTheRule) {
  EXPECT_EQ(error_of({"stages"}), "unrecognised argument 'stages'");
  EXPECT_EQ(error_of({"--stages=1,x"}), "--stages=1,x: 'x' is not an integer");
  EXPECT_EQ(error_of({"--stages="}), "--stages needs at least one value");
  EXPECT_EQ(error_of({"--stages=4"}),
            "--stages: stage 4 is not a ZeRO stage (0, 1, 2, 3)");
  EXPECT_EQ(error_of({"--world=0"}), "--world: 0 must be >= 1");
  EXPECT_EQ(error_of({"--scaling=sum"}),
            "--scaling: 'sum' is not one of configured, per_step_count, none");
  EXPECT_EQ(error_of({"--dtype=fp8"}),
            "--dtype: 'fp8' is not one of fp32, bf16, fp16");
  EXPECT_EQ(error_of({"--offload=disk"}),
            "--offload: 'disk' is not one of none, cpu, nvme");
  EXPECT_EQ(error_of({"--backend=nccl"}),
            "--backend=nccl: not one of sim, gloo");
  EXPECT_EQ(error_of({"--device=gpu"}), "--device=gpu: not one of cpu, cuda");
  EXPECT_EQ(error_of({"--managed=yes"}),
            "--managed=yes: not one of both, true, false");
  EXPECT_EQ(error_of({"--seed=-1"}),
            "--seed=-1: not a non-negative integer of at most 64 bits");
  EXPECT_EQ(error_of({"--alpha=0"}), "--alpha=0: must be > 0");
  EXPECT_EQ(error_of({"--clip=x"}), "--clip=x: not a number");
  EXPECT_EQ(error_of({"--clip=-1"}), "--clip must be >= 0 (0 = off)");
  EXPECT_EQ(error_of({"--sub-group-size=0"}), "--sub-group-size must be >= 1");
  EXPECT_EQ(error_of({"--swarm=-1"}), "--swarm must be >= 0");
  EXPECT_EQ(error_of({"--faults=crash:0@1", "--swarm=2"}),
            "--faults and --swarm exclude each other (--swarm draws the "
            "faults from the seed)");
  EXPECT_EQ(error_of({"--simulate-scale", "--swarm=2"}),
            "--simulate-scale runs without faults (symmetric ranks)");
  EXPECT_EQ(error_of({"--max-reuse-distance=0"}),
            "--max-reuse-distance is for --simulate-scale; a parity run takes "
            "zero_optimization.stage3_max_reuse_distance from its --config "
            "file");
  EXPECT_EQ(error_of({"--backwards=2,5", "--steps=3"}),
            "--steps=3 disagrees with the 2 entries of --backwards");
}

// A fourth field says what overflows: "loss" (as without it) or "element".
TEST(HarnessFlagsTest, OverflowKindIsLossOrElement) {
  const HarnessFlags element =
      parse({"--dtype=fp16", "--world=2,3", "--overflow=1:1:2:element"});
  EXPECT_EQ(element.overflow, (std::vector<int>{1, 1, 2}));
  EXPECT_TRUE(element.overflow_element);
  const HarnessFlags loss = parse({"--dtype=fp16", "--overflow=0:0:3:loss"});
  EXPECT_EQ(loss.overflow, (std::vector<int>{0, 0, 3}));
  EXPECT_FALSE(loss.overflow_element);
  // The last --overflow wins, kind included.
  EXPECT_FALSE(
      parse({"--dtype=fp16", "--overflow=0:0:0:element", "--overflow=0:0:1"})
          .overflow_element);
  EXPECT_EQ(error_of({"--dtype=fp16", "--overflow=1:1:2:elem"}),
            "--overflow=1:1:2:elem: 'elem' is not one of loss, element");
  EXPECT_EQ(error_of({"--dtype=fp16", "--overflow=1:1:element"}),
            "--overflow=1:1:element: 'element' is not an integer");
  EXPECT_EQ(error_of({"--dtype=fp16", "--overflow=1:1:2:element:0"}),
            "--overflow=1:1:2:element:0: write WINDOW:RANK:BACKWARD[:KIND], "
            "e.g. 1:0:2 or 1:0:2:element");
  // The kind changes nothing about where the overflow may go.
  EXPECT_EQ(error_of({"--dtype=fp16", "--world=2", "--overflow=0:2:0:element"}),
            "--overflow: rank 2 does not exist in --world=2");
  EXPECT_EQ(error_of({"--overflow=0:0:0:element"}),
            "--overflow needs fp16 among --dtype (only fp16 skips overflowing "
            "windows)");
}

TEST(HarnessFlagsTest, OverflowIsCheckedAgainstTheRun) {
  EXPECT_EQ(error_of({"--overflow=1:0"}),
            "--overflow=1:0: write WINDOW:RANK:BACKWARD[:KIND], e.g. 1:0:2 "
            "or 1:0:2:element");
  EXPECT_EQ(error_of({"--overflow=1::2"}),
            "--overflow=1::2: '' is not an integer");
  EXPECT_EQ(error_of({"--overflow=0:0:0"}),
            "--overflow needs fp16 among --dtype (only fp16 skips overflowing "
            "windows)");
  EXPECT_EQ(error_of({"--dtype=fp16", "--overflow=3:0:0"}),
            "--overflow: window 3 is not one of the run's 3 windows (0-based)");
  EXPECT_EQ(error_of({"--dtype=fp16", "--world=2,4", "--overflow=0:2:0"}),
            "--overflow: rank 2 does not exist in --world=2");
  EXPECT_EQ(error_of({"--dtype=fp16", "--backwards=2,5", "--overflow=0:0:2"}),
            "--overflow: window 0 has 2 backward() calls; backward 2 is not "
            "one of them (0-based)");
  EXPECT_EQ(error_of({"--dtype=fp16", "--backwards=2,5", "--overflow=1:0:4"}),
            "");
}

}  // namespace
}  // namespace zerostep
