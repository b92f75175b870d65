// own_model: a user's own plain-LibTorch model (embedding, two residual
// blocks, head) trained with zerostep over Gloo, one rank per process.
//
//   RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p
//     own_model --stage=3 --steps=4 --dir=/tmp/ckpt [--save-at=2]
//     [--resume] [--export=/tmp/model.safetensors]
//
// Each step is N backward() calls chosen here (managed_gradient_accumulation
// = false: the caller owns the boundary) followed by one step(), in bf16
// with clipping and a warmup schedule. --save-at=K saves a checkpoint
// "step<K>" after step K; --resume loads the newest one (`latest`) and
// continues from its step. --export writes the trained model as
// safetensors (the module's parameter names, float32), which
// Hugging Face, PyTorch and inference stacks read. The last line, on rank
// 0, is
// "digest <FNV-1a 64 of every trainable float32 parameter>": a resumed run
// must print the digest of the run that never stopped.
//
// The blocks derive from zerostep::Zero3Block, the one change stage 3 asks
// of a model: without it stage 3 trains correctly but keeps every
// parameter whole on every rank (and says so through the log hook).
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "blocks/zero3_block.h"
#include "comm/gloo_world.h"
#include "common/cli.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"

namespace {

constexpr int64_t kVocab = 64;
constexpr int64_t kWidth = 32;
constexpr int64_t kMicroBatch = 4;
constexpr int64_t kSeqLen = 8;

// A residual MLP block; zero3_block() lets a stage 3 engine gather its
// parameters for its forward and backward only.
class BlockImpl : public torch::nn::Module, public zerostep::Zero3Block {
 public:
  BlockImpl()
      : norm_(register_module(
            "norm", torch::nn::LayerNorm(
                        torch::nn::LayerNormOptions({kWidth})))),
        up_(register_module("up", torch::nn::Linear(kWidth, 4 * kWidth))),
        down_(register_module("down", torch::nn::Linear(4 * kWidth, kWidth))) {
  }
  torch::Tensor forward(torch::Tensor x) {
    return zerostep::zero3_block(*this, x, [&](const torch::Tensor& h) {
      return h + down_(torch::gelu(up_(norm_(h))));
    });
  }

 private:
  torch::nn::LayerNorm norm_;
  torch::nn::Linear up_, down_;
};
TORCH_MODULE(Block);

// Next-token prediction over a tiny vocabulary.
class ModelImpl : public torch::nn::Module {
 public:
  ModelImpl()
      : embed_(register_module("embed", torch::nn::Embedding(kVocab, kWidth))),
        block0_(register_module("block0", Block())),
        block1_(register_module("block1", Block())),
        head_(register_module("head", torch::nn::Linear(kWidth, kVocab))) {}
  torch::Tensor loss(const torch::Tensor& tokens) {
    torch::Tensor x = embed_(tokens.narrow(1, 0, kSeqLen - 1));
    x = block1_(block0_(x));
    torch::Tensor logits = head_(x).to(torch::kFloat32);
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, kVocab}),
        tokens.narrow(1, 1, kSeqLen - 1).reshape({-1}));
  }

 private:
  torch::nn::Embedding embed_;
  Block block0_, block1_;
  torch::nn::Linear head_;
};
TORCH_MODULE(Model);

std::string config_json(int stage) {
  return R"({
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "managed_gradient_accumulation": false,
    "gradient_accumulation_scaling": "per_step_count",
    "gradient_clipping": 1.0,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_num_steps": 3, "warmup_type": "linear"}},
    "zero_optimization": {"stage": )" +
         std::to_string(stage) +
         R"(, "stage3_param_persistence_threshold": 0}
  })";
}

// Micro-batch `i` of rank `rank` in step `step`: a deterministic function
// of the three, so a resumed run sees the data the first run would have.
torch::Tensor batch(int64_t step, int i, int rank, int world) {
  torch::Generator g = torch::make_generator<torch::CPUGeneratorImpl>(
      static_cast<uint64_t>(((step * 7 + i) * world + rank) * 7919 + 17));
  // Sequences that count up modulo the vocabulary from a random start: the
  // model can learn them.
  torch::Tensor start =
      torch::randint(kVocab, {kMicroBatch, 1}, g, torch::kLong);
  return (start + torch::arange(kSeqLen, torch::kLong)) % kVocab;
}

uint64_t fnv1a(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < static_cast<size_t>(c.nbytes()); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

struct Flags {
  int stage = 0;
  int64_t steps = 4;
  int64_t save_at = -1;
  bool resume = false;
  std::string dir;
  std::string export_path;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("stage")) {
      f.stage = static_cast<int>(zerostep::parse_int("--stage", v, 0, 3));
    } else if (const char* v = value("steps")) {
      f.steps = zerostep::parse_int("--steps", v, 1, INT64_MAX);
    } else if (const char* v = value("save-at")) {
      f.save_at = zerostep::parse_int("--save-at", v, 1, INT64_MAX);
    } else if (const char* v = value("dir")) {
      f.dir = v;
    } else if (const char* v = value("export")) {
      f.export_path = v;
    } else if (a == "--resume") {
      f.resume = true;
    } else {
      throw zerostep::UsageError(
          "unknown argument '" + a +
          "'; see the comment at the top of own_model.cc");
    }
  }
  if ((f.save_at >= 0 || f.resume) && f.dir.empty())
    throw zerostep::UsageError("--save-at and --resume need --dir");
  return f;
}

int run(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  std::unique_ptr<zerostep::GlooCommunicator> comm =
      zerostep::GlooCommunicator::from_environment();
  const int rank = comm->rank(), world = comm->world_size();
  const zerostep::Config config =
      zerostep::parse_config(config_json(f.stage), world);
  torch::manual_seed(42);  // the same initial weights on every rank
  Model model;
  zerostep::Engine engine(model.ptr(), config, comm.get());
  if (f.resume) engine.load_checkpoint(f.dir);  // the tag `latest` names
  // The caller owns the boundary: 2 or 3 backward() calls per step.
  for (int64_t step = engine.global_steps(); step < f.steps; ++step) {
    const int n = 2 + static_cast<int>(step % 2);
    double loss_sum = 0.0;
    for (int i = 0; i < n; ++i) {
      torch::Tensor loss = model->loss(batch(step, i, rank, world));
      loss_sum += loss.item<double>();
      engine.backward(loss);
    }
    engine.step();
    if (rank == 0)
      std::printf("step %lld n=%d loss %.5f lr %.6f\n",
                  static_cast<long long>(step), n, loss_sum / n,
                  engine.get_lr());
    if (step + 1 == f.save_at)
      engine.save_checkpoint(f.dir, "step" + std::to_string(step + 1));
  }
  if (!f.export_path.empty()) engine.export_full_model(f.export_path);
  const torch::Tensor params = engine.full_parameters();
  if (rank == 0)
    std::printf("digest %016llx\n",
                static_cast<unsigned long long>(fnv1a(params)));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "own_model: %s\n", e.what());
    return 1;
  }
}
