#include "tools/tinker/sampling.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "models/token_text.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/command.h"
#include "tools/tinker/request_fields.h"
#include "tools/tinker/retention.h"
#include "tools/tinker/tinker_public.pb.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// A copy of `m`'s current weights, base plus LoRA, on rank 0 (`keep`); an
// empty holder elsewhere. Every rank must call it: the trainable
// parameters are gathered with Engine::full_parameters() (a collective at
// stage 3, where each rank holds a partition); the frozen base weights are
// whole on every rank (the engine does not own them).
Net snapshot_of(Model& m, uint64_t seed, bool keep) {
  torch::Tensor full = m.engine->full_parameters();
  if (!keep) return Net();
  Net copy = new_net(m.base, m.lora, seed, NetWeights::kAnyValues);
  torch::NoGradGuard no_grad;
  auto dst = copy.module->named_parameters();
  int64_t offset = 0;
  for (const auto& item : m.net.module->named_parameters()) {
    torch::Tensor d = dst[item.key()];
    if (item.value().requires_grad()) {
      d.copy_(full.narrow(0, offset, d.numel()).view_as(d));
      offset += d.numel();
    } else {
      d.copy_(item.value());
    }
  }
  ZS_CHECK(offset == full.numel());
  for (torch::Tensor& p : copy.module->parameters()) p.set_requires_grad(false);
  return copy;
}

// stop: null/absent (none), a string or a list of strings (stop strings,
// matched in the decoded text: Note [Stop strings] in models/sampler.h), or
// a list of token ids (each a stop token of its own).
void parse_stop(const json& params, SamplingOptions* o) {
  if (!params.contains("stop") || params["stop"].is_null()) return;
  const json& stop = params["stop"];
  if (stop.is_string()) {
    o->stop_strings.push_back(stop.get<std::string>());
    return;
  }
  const std::string rule =
      "sampling_params.stop must be a string, a list of strings or a list "
      "of token ids (not a mix)";
  if (!stop.is_array())
    throw UsageError(rule + "; got " + elide(stop.dump(), 80));
  bool strings = false, ints = false;
  for (const json& s : stop) {
    if (s.is_string()) {
      strings = true;
      o->stop_strings.push_back(s.get<std::string>());
    } else if (is_int64(s)) {
      ints = true;
      o->stop.push_back({s.get<int64_t>()});
    } else {
      throw UsageError(rule + "; got an element " + elide(s.dump(), 80));
    }
  }
  if (strings && ints) throw UsageError(rule + "; got a mix");
}

// A list of integers of the JSON TensorData field `key` ("where" names it).
std::vector<int64_t> int_list(const json& t, const char* key,
                              const std::string& where) {
  std::vector<int64_t> out;
  if (!t.contains(key) || t[key].is_null()) return out;
  if (!t[key].is_array())
    throw UsageError(where + "." + key + " must be a list of integers");
  for (const json& v : t[key]) {
    if (!is_int64(v))
      throw UsageError(where + "." + key + " holds " + elide(v.dump(), 40) +
                       ", not an integer");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// target_prompt_logprobs: the SDK's JSON TensorData of int64 ids, shape
// [prompt_length - 1, K], dense or CSR.
IdTable parse_id_table(const json& t, int64_t prompt_length) {
  const std::string where = "target_prompt_logprobs";
  const std::string rule =
      " (it must be an int64 tensor of shape [len(prompt) - 1, K] = [" +
      std::to_string(prompt_length - 1) + ", K], dense or sparse CSR)";
  if (!t.is_object()) throw UsageError(where + " must be a TensorData object");
  if (get_or<std::string>(t, "dtype", "") != "int64")
    throw UsageError(where + " has dtype '" +
                     get_or<std::string>(t, "dtype", "") + "'" + rule);
  const std::vector<int64_t> shape = int_list(t, "shape", where);
  if (shape.size() != 2 || shape[0] != prompt_length - 1 || shape[1] < 1)
    throw UsageError(where + " has shape [" +
                     [&] {
                       std::string s;
                       for (size_t k = 0; k < shape.size(); ++k)
                         s += (k ? ", " : "") + std::to_string(shape[k]);
                       return s;
                     }() +
                     "]" + rule);
  IdTable ids;
  ids.rows = shape[0];
  ids.cols = shape[1];
  ids.values = int_list(t, "data", where);
  ids.crow = int_list(t, "sparse_crow_indices", where);
  ids.col = int_list(t, "sparse_col_indices", where);
  ids.sparse = !ids.crow.empty() || !ids.col.empty();
  if (!ids.sparse) {
    if (ids.rows > kMaxLogprobCells || ids.cols > kMaxLogprobCells ||
        static_cast<int64_t>(ids.values.size()) != ids.rows * ids.cols)
      throw UsageError(where + " holds " + std::to_string(ids.values.size()) +
                       " ids; its shape needs " +
                       std::to_string(ids.rows) + " x " +
                       std::to_string(ids.cols));
  } else {
    bool ok = static_cast<int64_t>(ids.crow.size()) == ids.rows + 1 &&
              ids.crow.front() == 0 &&
              ids.crow.back() == static_cast<int64_t>(ids.values.size()) &&
              ids.col.size() == ids.values.size();
    for (size_t r = 0; ok && r + 1 < ids.crow.size(); ++r) {
      ok = ids.crow[r] <= ids.crow[r + 1];
      for (int64_t k = ids.crow[r]; ok && k < ids.crow[r + 1]; ++k)
        ok = ids.col[k] >= 0 && ids.col[k] < ids.cols &&
             (k == ids.crow[r] || ids.col[k] > ids.col[k - 1]);
    }
    if (!ok)
      throw UsageError(where + " is not a consistent CSR tensor: " +
                       "sparse_crow_indices must be " +
                       std::to_string(ids.rows + 1) +
                       " non-decreasing row pointers from 0 to the number "
                       "of values, and each row's sparse_col_indices "
                       "increasing within [0, K)");
  }
  bool any = false;
  for (int64_t v : ids.values) any = any || v != -1;
  if (!any)
    throw UsageError(where + " names no token id (every cell is -1). Fix: "
                     "name at least one, or leave the field unset");
  return ids;
}

int64_t nonnegative(const json& a, const char* key) {
  if (a.contains(key) && a[key].is_null()) return 0;
  const int64_t v = get_or<int64_t>(a, key, 0);
  if (v < 0)
    throw UsageError(std::string(key) + " = " + std::to_string(v) +
                     " must be >= 0 (0: not asked)");
  return v;
}

// The k most likely tokens of each row of `lp` ([rows, V] log-softmax):
// descending, ties by lower id (a stable sort).
void topk_rows(const torch::Tensor& lp, int64_t k, TopkRows* out,
               int64_t first_row) {
  const auto sorted = torch::sort(lp, /*stable=*/true, /*dim=*/-1,
                                  /*descending=*/true);
  const torch::Tensor v = std::get<0>(sorted).narrow(1, 0, k).contiguous();
  const torch::Tensor i =
      std::get<1>(sorted).narrow(1, 0, k).to(torch::kInt32).contiguous();
  std::copy(v.data_ptr<float>(), v.data_ptr<float>() + v.numel(),
            out->logprobs.begin() + first_row * k);
  std::copy(i.data_ptr<int32_t>(), i.data_ptr<int32_t>() + i.numel(),
            out->ids.begin() + first_row * k);
}

TopkRows empty_rows(int64_t length, int64_t k) {
  TopkRows t;
  t.length = length;
  t.k = k;
  t.ids.assign(static_cast<size_t>(length * k), 0);
  t.logprobs.assign(static_cast<size_t>(length * k), -99999.0f);
  return t;
}

// log_softmax of a full forward of `tokens`: [len, V].
torch::Tensor full_logprobs(CausalLm& net, const std::vector<int64_t>& tokens) {
  torch::NoGradGuard no_grad;
  const torch::Tensor t =
      torch::from_blob(const_cast<int64_t*>(tokens.data()),
                       {1, static_cast<int64_t>(tokens.size())}, torch::kInt64)
          .clone();
  return torch::log_softmax(net.logits(t)[0].to(torch::kFloat), -1)
      .contiguous();
}

void set_topk(tinker_public::TopkLogprobs* m, const TopkRows& t) {
  m->set_k(static_cast<uint32_t>(t.k));
  m->set_length(static_cast<uint32_t>(t.length));
  m->set_token_ids(std::string(reinterpret_cast<const char*>(t.ids.data()),
                               t.ids.size() * sizeof(int32_t)));
  m->set_logprobs(std::string(reinterpret_cast<const char*>(t.logprobs.data()),
                              t.logprobs.size() * sizeof(float)));
}

void set_dense(tinker_public::Tensor* m, tinker_public::DType dtype,
               const void* data, size_t bytes, std::vector<int64_t> shape) {
  m->set_dtype(dtype);
  for (int64_t d : shape) m->add_shape(d);
  m->set_dense(std::string(static_cast<const char*>(data), bytes));
}

}  // namespace

SampleRequestIn parse_sample_request(const json& a, uint64_t default_seed) {
  SampleRequestIn in;
  if (!a.contains("prompt") || !a["prompt"].is_object() ||
      !a["prompt"].contains("chunks") || !a["prompt"]["chunks"].is_array())
    throw UsageError(
        "missing field 'prompt' (a ModelInput: {\"chunks\": [...]})");
  const json& chunks = a["prompt"]["chunks"];
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& c = chunks[i];
    const std::string type = get_or<std::string>(c, "type", "encoded_text");
    if (type != "encoded_text" || !c.contains("tokens") ||
        !c["tokens"].is_array())
      throw UsageError("prompt chunk " + std::to_string(i) + " has type '" +
                       type +
                       "': this server samples from token chunks "
                       "(encoded_text) only");
    for (const json& t : c["tokens"]) {
      if (!is_int64(t))
        throw UsageError(
            "prompt chunk " + std::to_string(i) +
            " holds a token that is not an integer: " + elide(t.dump(), 40));
      in.prompt.push_back(t.get<int64_t>());
    }
  }
  in.num_samples = get_or<int64_t>(a, "num_samples", 1);
  const json params =
      a.contains("sampling_params") ? a["sampling_params"] : json::object();
  if (!params.is_object())
    throw UsageError("field 'sampling_params' must be an object");
  SamplingOptions& o = in.options;
  // max_tokens is optional in the SDK; without it, the rest of the context
  // (resolved against the model by SamplerStore::sample).
  in.max_tokens_given =
      params.contains("max_tokens") && !params["max_tokens"].is_null();
  if (in.max_tokens_given)
    o.max_tokens = get_or<int64_t>(params, "max_tokens", 0, "sampling_params.");
  o.temperature =
      get_or<double>(params, "temperature", 1.0, "sampling_params.");
  o.top_k = get_or<int64_t>(params, "top_k", -1, "sampling_params.");
  o.top_p = get_or<double>(params, "top_p", 1.0, "sampling_params.");
  o.seed = params.contains("seed") && !params["seed"].is_null()
               ? get_or<uint64_t>(params, "seed", 0, "sampling_params.")
               : default_seed;
  parse_stop(params, &o);
  o.prompt_logprobs = get_or<bool>(a, "prompt_logprobs", false);
  if (a.contains("prompt_logprobs_last_n") &&
      !a["prompt_logprobs_last_n"].is_null()) {
    in.prompt_logprobs_last_n = get_or<int64_t>(a, "prompt_logprobs_last_n", 0);
    const int64_t n = static_cast<int64_t>(in.prompt.size());
    if (!o.prompt_logprobs)
      throw UsageError("prompt_logprobs_last_n needs prompt_logprobs = true");
    if (in.prompt_logprobs_last_n < 1 || in.prompt_logprobs_last_n > n - 1)
      throw UsageError(
          "prompt_logprobs_last_n = " +
          std::to_string(in.prompt_logprobs_last_n) +
          " must be in [1, len(prompt) - 1 = " + std::to_string(n - 1) + "]");
  }
  in.topk_prompt = nonnegative(a, "topk_prompt_logprobs");
  in.topk_sample = nonnegative(a, "topk_sample_logprobs");
  in.alt_tokens_k = nonnegative(a, "prompt_alt_tokens_k");
  if (a.contains("target_prompt_logprobs") &&
      !a["target_prompt_logprobs"].is_null())
    in.target_prompt = parse_id_table(a["target_prompt_logprobs"],
                                      static_cast<int64_t>(in.prompt.size()));
  in.record_stability_info = get_or<bool>(a, "record_stability_info", false);
  return in;
}

void check_logprob_requests(const SampleRequestIn& in, int64_t vocab) {
  const int64_t n = static_cast<int64_t>(in.prompt.size());
  auto width = [&](const char* field, int64_t k, int64_t rows) {
    if (k > vocab)
      throw UsageError(std::string(field) + " = " + std::to_string(k) +
                       " exceeds the model's vocabulary of " +
                       std::to_string(vocab) + " tokens");
    if (k > 0 && rows * k > kMaxLogprobCells)
      throw UsageError(std::string(field) + " = " + std::to_string(k) +
                       " over " + std::to_string(rows) + " positions asks " +
                       std::to_string(rows * k) + " logprobs; at most " +
                       std::to_string(kMaxLogprobCells) +
                       " per request. Fix: a smaller k or a shorter prompt");
  };
  width("topk_prompt_logprobs", in.topk_prompt, n);
  width("topk_sample_logprobs", in.topk_sample,
        in.options.max_tokens * in.num_samples);
  width("prompt_alt_tokens_k", in.alt_tokens_k, n);
  if (in.target_prompt) {
    std::vector<int64_t> distinct;
    for (int64_t id : in.target_prompt->values) {
      if (id == -1) continue;
      if (id < 0 || id >= vocab)
        throw UsageError("target_prompt_logprobs holds token id " +
                         std::to_string(id) + ", outside the vocabulary [0, " +
                         std::to_string(vocab) + ") (-1 asks nothing)");
      distinct.push_back(id);
    }
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()),
                   distinct.end());
    width("target_prompt_logprobs (distinct ids)",
          static_cast<int64_t>(distinct.size()), n);
  }
}

SampleExtras compute_sample_extras(CausalLm& net, const SampleRequestIn& in,
                                   const SampleOutput& out) {
  SampleExtras x;
  const int64_t n = static_cast<int64_t>(in.prompt.size());
  if (in.topk_prompt > 0 || in.target_prompt || in.alt_tokens_k > 0) {
    // Row i predicts prompt position i + 1.
    const torch::Tensor lp = full_logprobs(net, in.prompt);
    if (in.topk_prompt > 0) {
      x.topk_prompt = empty_rows(n, in.topk_prompt);
      const int64_t first =
          in.prompt_logprobs_last_n > 0 ? n - in.prompt_logprobs_last_n : 1;
      if (first < n)
        topk_rows(lp.narrow(0, first - 1, n - first), in.topk_prompt,
                  &*x.topk_prompt, first);
    }
    if (in.target_prompt) {
      const IdTable& ids = *in.target_prompt;
      x.target_ids = ids;
      x.target_logprobs.assign(ids.values.size(), 0.0f);
      const float* rows = lp.data_ptr<float>();
      const int64_t v = lp.size(1);
      for (int64_t r = 0; r < ids.rows; ++r) {
        const int64_t begin = ids.sparse ? ids.crow[r] : r * ids.cols;
        const int64_t end = ids.sparse ? ids.crow[r + 1] : begin + ids.cols;
        for (int64_t k = begin; k < end; ++k)
          if (ids.values[k] != -1)
            x.target_logprobs[k] = rows[r * v + ids.values[k]];
      }
    }
    if (in.alt_tokens_k > 0) {
      x.alt_k = in.alt_tokens_k;
      SamplingOptions draw;
      draw.temperature = in.options.temperature;
      const torch::Tensor logits = lp;  // log_softmax: same choices as logits
      // One stream for the request's draws, apart from the samples' own
      // (sample i uses (seed, i)).
      SampleRng rng(in.options.seed ^ 0x5eed'a17e'0000'0000ULL);
      const int64_t v = lp.size(1);
      for (int64_t r = 0; r + 1 < n; ++r)
        for (int64_t j = 0; j < in.alt_tokens_k; ++j) {
          const float* row = logits.data_ptr<float>() + r * v;
          const int64_t id = choose_token(row, v, draw, rng.uniform());
          x.alt_tokens.push_back(id);
          x.alt_logprobs.push_back(row[id]);
        }
    }
  }
  if (in.topk_sample > 0) {
    for (const SampledSequence& s : out.sequences) {
      TopkRows t = empty_rows(static_cast<int64_t>(s.tokens.size()),
                              in.topk_sample);
      if (!s.tokens.empty()) {
        std::vector<int64_t> seq = in.prompt;
        seq.insert(seq.end(), s.tokens.begin(), s.tokens.end() - 1);
        const torch::Tensor lp = full_logprobs(net, seq);
        topk_rows(lp.narrow(0, n - 1, t.length), in.topk_sample, &t, 0);
      }
      x.topk_sample.push_back(std::move(t));
    }
  }
  return x;
}

std::string encode_sample_response(const SampleOutput& out,
                                   const SampleExtras& x) {
  tinker_public::SampleResponse r;
  for (size_t i = 0; i < out.sequences.size(); ++i) {
    const SampledSequence& s = out.sequences[i];
    tinker_public::SampledSequence* q = r.add_sequences();
    q->set_stop_reason(s.stopped ? tinker_public::STOP_REASON_STOP
                                 : tinker_public::STOP_REASON_LENGTH);
    std::vector<int32_t> tokens(s.tokens.begin(), s.tokens.end());
    q->set_tokens(std::string(reinterpret_cast<const char*>(tokens.data()),
                              tokens.size() * sizeof(int32_t)));
    q->set_logprobs(
        std::string(reinterpret_cast<const char*>(s.logprobs.data()),
                    s.logprobs.size() * sizeof(float)));
    if (i < x.topk_sample.size())
      set_topk(q->mutable_topk_sampled_logprobs(), x.topk_sample[i]);
  }
  if (!out.prompt_logprobs.empty())
    r.set_prompt_logprobs(
        std::string(reinterpret_cast<const char*>(out.prompt_logprobs.data()),
                    out.prompt_logprobs.size() * sizeof(float)));
  if (x.topk_prompt) set_topk(r.mutable_topk_prompt_logprobs(), *x.topk_prompt);
  if (x.target_ids) {
    const IdTable& ids = *x.target_ids;
    tinker_public::Tensor* t = r.mutable_target_prompt_logprobs();
    if (!ids.sparse) {
      set_dense(t, tinker_public::DTYPE_FLOAT32, x.target_logprobs.data(),
                x.target_logprobs.size() * sizeof(float),
                {ids.rows, ids.cols});
    } else {
      t->set_dtype(tinker_public::DTYPE_FLOAT32);
      t->add_shape(ids.rows);
      t->add_shape(ids.cols);
      tinker_public::SparseCsr* csr = t->mutable_sparse_csr();
      csr->set_values(std::string(
          reinterpret_cast<const char*>(x.target_logprobs.data()),
          x.target_logprobs.size() * sizeof(float)));
      csr->set_crow_indices(
          std::string(reinterpret_cast<const char*>(ids.crow.data()),
                      ids.crow.size() * sizeof(int64_t)));
      csr->set_col_indices(
          std::string(reinterpret_cast<const char*>(ids.col.data()),
                      ids.col.size() * sizeof(int64_t)));
    }
  }
  if (x.alt_k > 0) {
    const int64_t rows = static_cast<int64_t>(x.alt_tokens.size()) / x.alt_k;
    tinker_public::PromptAltTokens* alt = r.mutable_prompt_alt_tokens();
    set_dense(alt->mutable_tokens(), tinker_public::DTYPE_INT64,
              x.alt_tokens.data(), x.alt_tokens.size() * sizeof(int64_t),
              {rows, x.alt_k});
    set_dense(alt->mutable_logprobs(), tinker_public::DTYPE_FLOAT32,
              x.alt_logprobs.data(), x.alt_logprobs.size() * sizeof(float),
              {rows, x.alt_k});
  }
  return r.SerializeAsString();
}

std::shared_ptr<const SamplerStore::TokenTable> SamplerStore::token_text(
    const BaseModel& base) {
  auto it = token_texts_.find(base.name);
  if (it != token_texts_.end()) return it->second;
  auto t = std::make_shared<TokenTable>();
  if (!base.is_hf()) {  // a preset's tokens are bytes
    for (int64_t b = 0; b < base.vocab_size; ++b)
      t->bytes.push_back(std::string(1, static_cast<char>(b)));
  } else {
    try {
      t->bytes = TokenText::read_folder(base.hf_dir).table(base.vocab_size);
    } catch (const Error& e) {
      t->problem = e.what();
    }
  }
  token_texts_[base.name] = t;
  return t;
}

SamplerStore::SamplerStore(Communicator* comm, std::string state_dir)
    : comm_(comm), state_dir_(std::move(state_dir)) {}

bool SamplerStore::agree(bool mine) {
  int64_t v = mine ? 1 : 0;
  comm_->broadcast(Buffer::of(&v, 1), {0, phase::kSetup});
  return v != 0;
}

uint64_t sampler_bytes_bound(Model& m) {
  uint64_t numel = 0, tensors = 0;
  for (const torch::Tensor& p : m.net.module->parameters()) {
    numel += static_cast<uint64_t>(p.numel());
    ++tensors;
  }
  // torch::save's zip archive: each tensor's bytes 64-byte aligned with a
  // local and a central header, and the pickled module structure.
  return 4 * numel + 512 * tensors + (64 << 10);
}

json SamplerStore::save_for_sampler(ModelRegistry& models,
                                    const Caller& caller, const json& a) {
  Model& m = models.get(require_string(a, "model_id"), caller.tenant);
  const bool named = a.contains("path") && !a["path"].is_null();
  const bool rank0 = comm_->rank() == 0;
  if (named) {
    const std::string name = require_string(a, "path");
    const std::optional<int64_t> expires = expiry_from_ttl(
        a, "ttl_seconds", unix_now(), "save_weights_for_sampler");
    if (!safe_checkpoint_name(name))
      throw UsageError("save_weights_for_sampler name (field 'path') '" +
                       elide(name, 140) +
                       "' must be 1-128 characters of [A-Za-z0-9._-] (and "
                       "not 'latest')");
    const std::string path = "tinker://" + m.id + "/sampler_weights/" + name;
    const CheckpointLocation at =
        *locate_checkpoint(state_dir_, caller.tenant, path, "sampler_weights");
    const std::string dir = at.dir;
    if (!agree(!rank0 || within_dir(state_dir_, dir)))
      throw UsageError("sampler weights '" + path +
                       "' would leave this server's state directory (a "
                       "symbolic link?). Nothing was written");
    if (agree(rank0 && (paths_.count(dir) != 0 ||
                        std::ifstream(dir + "/weights.pt").good())))
      throw UsageError("sampler weights '" + path +
                       "' exist already. Fix: choose another name");
    if (caller.max_bytes) {
      const std::string refusal =
          rank0 ? over_bytes_quota(
                      caller, "save_weights_for_sampler '" + name + "'",
                      tree_bytes(tenant_dir(state_dir_, caller.tenant)),
                      sampler_bytes_bound(m))
                : "";
      if (!agree(refusal.empty())) {
        if (rank0) throw UsageError(refusal);
        throw UsageError("save_weights_for_sampler '" + name +
                         "' is over the tenant's quota (rank 0 says how "
                         "much). Nothing was written");
      }
    }
    Net net = snapshot_of(m, models.base_seed(), rank0);
    if (rank0) {
      auto s = std::make_shared<Sampler>();
      s->net = net;
      s->base_model = m.base.name;
      s->text = token_text(m.base);
      s->model_path = path;
      s->expires_at = expires;
      try {
        std::filesystem::create_directories(dir);
        json meta = {{"base_model", m.base.name},
                     {"model_id", m.id},
                     {"lora", lora_to_json(m.lora)}};
        if (!m.user_metadata.is_null()) meta["user_metadata"] = m.user_metadata;
        if (expires) meta["expires_at"] = *expires;
        // The meta first: the weights file marks a whole save.
        atomic_write_file(dir + "/tinker_meta.json", meta.dump(1));
        torch::save(net.module, dir + "/weights.pt.tmp");
        std::filesystem::rename(dir + "/weights.pt.tmp", dir + "/weights.pt");
      } catch (const std::exception&) {
        // The snapshot still serves this run; only persistence failed.
        throw IoError("sampler weights '" + path +
                      "' could not be written to the server's state "
                      "directory (see the server's disk)");
      }
      paths_[dir] = s;
    }
    return {{"path", path}, {"type", "save_weights_for_sampler"}};
  }
  int64_t sampling_seq = 0;
  if (!get_int64(a, "sampling_session_seq_id", &sampling_seq))
    throw UsageError(
        "save_weights_for_sampler needs 'path' (a name) or an integer "
        "'sampling_session_seq_id'");
  const std::string id = m.id + ":sample:" + std::to_string(sampling_seq);
  if (agree(rank0 && sessions_.count(id) != 0))
    throw UsageError("sampling session '" + id + "' exists already");
  Net net = snapshot_of(m, models.base_seed(), rank0);
  if (rank0) {
    auto s = std::make_shared<Sampler>();
    s->net = net;
    s->base_model = m.base.name;
    s->text = token_text(m.base);
    sessions_[id] = s;
  }
  return {{"sampling_session_id", id}, {"type", "save_weights_for_sampler"}};
}

std::shared_ptr<SamplerStore::Sampler> SamplerStore::by_path(
    const Caller& caller, const std::string& path) {
  const std::optional<CheckpointLocation> at =
      locate_checkpoint(state_dir_, caller.tenant, path, "sampler_weights");
  if (!at) {
    if (locate_checkpoint(state_dir_, caller.tenant, path, "weights"))
      throw UsageError("model_path '" + elide(path, 200) +
                       "' is a training checkpoint (save_state); sampling "
                       "reads sampler weights. Fix: save them with "
                       "save_weights_for_sampler(name) and pass the path it "
                       "returns (tinker://<model id>/sampler_weights/<name>)");
    throw UsageError("model_path '" + elide(path, 200) +
                     "' is not sampler weights of this server: expected "
                     "tinker://<model id>/sampler_weights/<name>");
  }
  const std::string dir = at->dir;
  const int64_t now = unix_now();
  auto it = paths_.find(dir);
  if (it != paths_.end()) {
    if (!it->second->expires_at || *it->second->expires_at > now)
      return it->second;
    paths_.erase(it);  // expired: read again below, and found gone
  }
  auto s = std::make_shared<Sampler>();
  try {
    if (!within_dir(state_dir_, dir)) throw UsageError("outside");
    const json meta = json::parse(read_file(dir + "/tinker_meta.json"));
    if (expired(meta, now)) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      throw UsageError("expired");
    }
    if (meta.contains("expires_at")) s->expires_at = meta["expires_at"];
    s->base_model = meta.at("base_model").get<std::string>();
    const BaseModel& base = find_base_model(s->base_model);
    s->net = new_net(base, lora_from_json(meta.at("lora")), 0,
                     NetWeights::kAnyValues);
    torch::load(s->net.module, dir + "/weights.pt");
    s->text = token_text(base);
  } catch (const std::exception&) {
    // Names the client's path only, never a server file; the same answer
    // for another tenant's path (Note [One tenant check] in tenancy.h).
    throw UsageError("sampler weights '" + elide(path, 200) +
                     "' cannot be read: this server has none of that name "
                     "(deleted, expired, or never saved with "
                     "save_weights_for_sampler)");
  }
  for (torch::Tensor& p : s->net.module->parameters())
    p.set_requires_grad(false);
  s->model_path = path;
  paths_[dir] = s;
  return s;
}

void SamplerStore::forget(const Caller& caller, const std::string& path) {
  if (auto at = locate_checkpoint(state_dir_, caller.tenant, path,
                                  "sampler_weights"))
    paths_.erase(at->dir);
}

std::shared_ptr<SamplerStore::Sampler> SamplerStore::by_base(
    ModelRegistry& models, const std::string& base_model) {
  auto it = bases_.find(base_model);
  if (it != bases_.end()) return it->second;
  auto s = std::make_shared<Sampler>();
  const BaseModel& base = find_base_model(base_model);  // UsageError if unknown
  s->base_model = base.name;
  s->net = new_net(base, LoraOptions(), models.base_seed());
  s->text = token_text(base);
  for (torch::Tensor& p : s->net.module->parameters())
    p.set_requires_grad(false);
  bases_[base_model] = s;
  return s;
}

std::shared_ptr<SamplerStore::Sampler> SamplerStore::session(
    const std::string& id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) throw UsageError(unknown_sampling_session(id));
  return it->second;
}

json SamplerStore::create_session(ModelRegistry& models, const Caller& caller,
                                  const json& a) {
  const std::string owner = require_string(a, "session_id");
  const int64_t seq = get_or<int64_t>(a, "sampling_session_seq_id", -1);
  if (seq < 0)
    throw UsageError(
        "create_sampling_session needs an integer sampling_session_seq_id "
        ">= 0");
  const std::string id = owner + ":sample:" + std::to_string(seq);
  const std::string path = get_or<std::string>(a, "model_path", "");
  const std::string base = get_or<std::string>(a, "base_model", "");
  std::shared_ptr<Sampler> s;
  if (!path.empty()) {
    s = by_path(caller, path);
    if (!base.empty() && base != s->base_model)
      throw UsageError("base_model '" + elide(base, 100) +
                       "' does not match model_path '" + path +
                       "', which holds " + s->base_model +
                       ". Fix: omit base_model or pass " + s->base_model);
  } else if (!base.empty()) {
    s = by_base(models, base);
  } else {
    throw UsageError("create_sampling_session needs model_path or base_model");
  }
  auto it = sessions_.find(id);
  if (it != sessions_.end() && it->second != s)
    throw UsageError("sampling session '" + id +
                     "' exists already with other weights");
  sessions_[id] = s;
  return {{"type", "create_sampling_session"}, {"sampling_session_id", id}};
}

json SamplerStore::get_sampler(const json& a) {
  const std::string id = require_string(a, "sampler_id");
  std::shared_ptr<Sampler> s = session(id);
  json out = {{"sampler_id", id}, {"base_model", s->base_model}};
  if (!s->model_path.empty()) out["model_path"] = s->model_path;
  return out;
}

std::string SamplerStore::sample(ModelRegistry& models, const Caller& caller,
                                 const json& a) {
  std::shared_ptr<Sampler> s;
  std::string seed_key;
  if (a.contains("sampling_session_id") &&
      !a["sampling_session_id"].is_null()) {
    const std::string id = require_string(a, "sampling_session_id");
    s = session(id);
    seed_key = id + "#" + std::to_string(get_or<int64_t>(a, "seq_id", 0));
  } else if (a.contains("model_path") && a["model_path"].is_string()) {
    s = by_path(caller, a["model_path"].get<std::string>());
  } else if (a.contains("base_model") && a["base_model"].is_string()) {
    s = by_base(models, a["base_model"].get<std::string>());
  } else {
    throw UsageError(
        "a sample request needs sampling_session_id, model_path or "
        "base_model");
  }
  if (seed_key.empty()) seed_key = a.dump();
  SampleRequestIn in =
      parse_sample_request(a, fnv1a64(seed_key.data(), seed_key.size()));
  if (!in.max_tokens_given)
    in.options.max_tokens =
        s->net.lm->context_length() - static_cast<int64_t>(in.prompt.size());
  check_logprob_requests(in, s->net.lm->vocab_size());
  // The base's EOS ends every sample; stop strings read its tokenizer.
  for (int64_t eos : find_base_model(s->base_model).eos_token_ids)
    in.options.stop.push_back({eos});
  if (!in.options.stop_strings.empty()) {
    if (!s->text->problem.empty())
      throw UsageError("sampling_params.stop holds strings, and " +
                       s->base_model + "'s tokens cannot be decoded here: " +
                       s->text->problem + ". Fix: stop on token ids");
    in.options.token_text = &s->text->bytes;
  }
  std::string session, request_id;
  if (in.record_stability_info) {
    if (!a.contains("sampling_session_id") || !a["sampling_session_id"].is_string())
      throw UsageError(
          "record_stability_info needs a sampling_session_id: recorded "
          "sequences belong to a session (the SDK's SamplingClient sends "
          "one)");
    session = session_of(a["sampling_session_id"].get<std::string>());
    request_id = get_or<std::string>(a, "zerostep_request_id", "");
    if (request_id.empty())
      throw InternalError("a sample command without its request id");
  }
  SampleOutput out =
      zerostep::sample(*s->net.lm, in.prompt, in.num_samples, in.options);
  if (in.prompt_logprobs_last_n > 0) {
    const size_t scored = static_cast<size_t>(in.prompt_logprobs_last_n);
    for (size_t i = 0; i + scored < out.prompt_logprobs.size(); ++i)
      out.prompt_logprobs[i] = std::numeric_limits<float>::quiet_NaN();
  }
  const SampleExtras extras = compute_sample_extras(*s->net.lm, in, out);
  if (in.record_stability_info) {
    stability_.expire();
    for (size_t i = 0; i < out.sequences.size(); ++i)
      stability_.record(request_id + ":" + std::to_string(i),
                        {caller.tenant, session, in.prompt,
                         out.sequences[i].tokens, out.sequences[i].logprobs});
  }
  return encode_sample_response(out, extras);
}

}  // namespace tinker
}  // namespace zerostep
