// zerostep_run: the zerostep side of the conformance run against DeepSpeed
// (conformance/, issue 47). One rank of a job started with torchrun's
// variables (tools/launch --nproc=W):
//
//   bazel-bin/tools/launch --nproc=2 -- bazel-bin/conformance/zerostep_run
//       --dir=RUN [--cases=a,b]
//
// For every case of RUN/cases.json whose world is WORLD_SIZE (or each one
// named): the tiny GPT (models/tiny_gpt.h) at conformance/cases.py's shape,
// an Engine from the case's ds_config (the very JSON DeepSpeed is given),
// the weights of the case's file (Engine::load_model_weights), then
// for each step N micro-batches of RUN/data.bin (rank r's i-th is
// data[i, r]): the task's loss (mean cross-entropy of the float32 logits),
// engine.backward(loss); unmanaged: engine.step() after the N-th, managed:
// after each. Rank 0 writes RUN/zerostep/<case>.json and .params in the
// formats conformance/cases.py describes. One compute thread, as the
// DeepSpeed side.
//
// Errors: UsageError / IoError naming the file or flag, exit status 1.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "comm/gloo_world.h"
#include "common/cli.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "runtime/runtime_info.h"

namespace zerostep {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("zerostep_run: cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw IoError("zerostep_run: cannot write " + path);
}

// The constants of conformance/cases.py this side needs, read from the
// cases file's first case and the data file's size.
struct Shape {
  TinyGptOptions model;
  int64_t micro_batch = 0;
  int64_t micro_max = 0;
  int64_t world_max = 0;
};

struct Options {
  std::string dir;
  std::set<std::string> cases;  // empty: every case of this world
  Shape shape;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--dir=", 0) == 0) {
      o.dir = a.substr(6);
    } else if (a.rfind("--cases=", 0) == 0) {
      std::stringstream list(a.substr(8));
      for (std::string c; std::getline(list, c, ',');)
        if (!c.empty()) o.cases.insert(c);
    } else if (a.rfind("--shape=", 0) == 0) {
      // vocab,d_model,n_layer,n_head,block_size,micro_batch,micro_max,world_max
      std::stringstream list(a.substr(8));
      std::vector<int64_t> v;
      for (std::string c; std::getline(list, c, ',');)
        v.push_back(parse_int("--shape", c, 1, 1 << 20));
      if (v.size() != 8)
        throw UsageError("zerostep_run: --shape=" + a.substr(8) +
                         " needs 8 numbers (vocab,d_model,n_layer,n_head,"
                         "block_size,micro_batch,micro_max,world_max)");
      o.shape.model.vocab_size = v[0];
      o.shape.model.d_model = v[1];
      o.shape.model.n_layer = v[2];
      o.shape.model.n_head = v[3];
      o.shape.model.block_size = v[4];
      o.shape.micro_batch = v[5];
      o.shape.micro_max = v[6];
      o.shape.world_max = v[7];
    } else {
      throw UsageError("zerostep_run: unknown argument '" + a +
                       "' (--dir=RUN --shape=... [--cases=a,b])");
    }
  }
  if (o.dir.empty() || o.shape.micro_batch == 0)
    throw UsageError(
        "zerostep_run: --dir and --shape are required (conformance/conform.py "
        "passes them)");
  return o;
}

// data.bin as a tensor [micro_max, world_max, micro_batch, block + 1].
torch::Tensor read_data(const Options& o) {
  const std::string path = o.dir + "/data.bin";
  std::string bytes = read_file(path);
  const Shape& s = o.shape;
  const int64_t n =
      s.micro_max * s.world_max * s.micro_batch * (s.model.block_size + 1);
  if (static_cast<int64_t>(bytes.size()) != n * 8)
    throw IoError("zerostep_run: " + path + " holds " +
                  std::to_string(bytes.size()) + " bytes, --shape says " +
                  std::to_string(n * 8));
  return torch::from_blob(bytes.data(), {n}, torch::kLong)
      .clone()
      .view({s.micro_max, s.world_max, s.micro_batch, s.model.block_size + 1});
}

void run_case(const nlohmann::json& c, const Options& o,
              const torch::Tensor& data, Communicator* comm) {
  const int rank = comm->rank();
  const std::unique_ptr<Task> task = make_gpt_task(o.shape.model);
  std::shared_ptr<torch::nn::Module> model = task->make_model(0);
  Engine engine(model, parse_config(c["config"].dump(), comm->world_size()),
                comm);
  engine.load_model_weights(o.dir + "/" + c["weights"].get<std::string>());
  const bool managed = c["mode"] == "managed";
  nlohmann::json losses = nlohmann::json::array(), steps = nlohmann::json::array();
  std::string params;
  int64_t micro = 0;
  for (const int64_t n : c["steps"].get<std::vector<int64_t>>()) {
    double lr = 0, scale_before = 0;
    for (int64_t i = 0; i < n; ++i) {
      const torch::Tensor batch = data[micro][rank];
      ++micro;
      const int64_t t = batch.size(1) - 1;
      const Batch b{batch.narrow(1, 0, t).contiguous(),
                    batch.narrow(1, 1, t).contiguous()};
      const torch::Tensor loss = task->loss(*model, b);
      losses.push_back(loss.item<float>());
      engine.backward(loss);
      if (managed || i == n - 1) {
        lr = engine.get_lr();
        scale_before = engine.loss_scale();
        engine.step();
      }
    }
    const double norm = engine.get_global_grad_norm();
    steps.push_back({{"lr", lr},
                     {"applied", engine.was_step_applied()},
                     {"grad_norm", norm < 0 ? nlohmann::json() : nlohmann::json(norm)},
                     {"loss_scale", engine.loss_scale()},
                     {"loss_scale_before", scale_before},
                     {"skipped_steps", engine.skipped_steps()},
                     {"global_steps", engine.global_steps()}});
    const torch::Tensor full = engine.full_parameters().contiguous();
    params.append(static_cast<const char*>(full.data_ptr()),
                  static_cast<size_t>(full.numel()) * sizeof(float));
  }
  // Every rank's losses, as the DeepSpeed side's all_gather_object.
  const torch::Tensor mine =
      torch::tensor(losses.get<std::vector<float>>(), torch::kFloat);
  std::vector<torch::Tensor> all(comm->world_size());
  for (int r = 0; r < comm->world_size(); ++r) {
    all[r] = r == rank ? mine.clone() : torch::zeros_like(mine);
  }
  torch::Tensor stacked = torch::stack(all);
  // One rank's row non-zero each: the sum is a gather.
  comm->all_reduce(Buffer::of(stacked.data_ptr<float>(),
                              static_cast<size_t>(stacked.numel())),
                   AllReduceOptions{});
  if (rank != 0) return;
  nlohmann::json per_rank = nlohmann::json::array();
  for (int r = 0; r < comm->world_size(); ++r) {
    nlohmann::json row = nlohmann::json::array();
    for (int64_t i = 0; i < stacked.size(1); ++i)
      row.push_back(stacked[r][i].item<float>());
    per_rank.push_back(row);
  }
  const nlohmann::json record = {
      {"losses", per_rank}, {"steps", steps}, {"runtime", runtime_info()}};
  const std::string base = o.dir + "/zerostep/" + c["name"].get<std::string>();
  write_file(base + ".json", record.dump());
  write_file(base + ".params", params);
  std::fprintf(stderr, "zerostep %s: done\n",
               c["name"].get<std::string>().c_str());
}

int main_impl(int argc, char** argv) {
  const Options o = parse(argc, argv);
  set_compute_threads(1);
  std::unique_ptr<Communicator> comm = GlooCommunicator::from_environment();
  const torch::Tensor data = read_data(o);
  const nlohmann::json cases = nlohmann::json::parse(read_file(o.dir + "/cases.json"));
  for (const nlohmann::json& c : cases) {
    if (c["world"].get<int>() != comm->world_size()) continue;
    if (!o.cases.empty() && !o.cases.count(c["name"].get<std::string>())) continue;
    run_case(c, o, data, comm.get());
  }
  return 0;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
