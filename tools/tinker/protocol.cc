#include "tools/tinker/protocol.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/errors.h"
#include "tools/tinker/tinker_public.pb.h"

namespace zerostep {
namespace tinker {
namespace {

std::string datum_field(size_t i, const std::string& key) {
  return "data[" + std::to_string(i) + "].loss_fn_inputs['" + key + "']";
}

constexpr uint64_t kMaxSparseElements = uint64_t{1} << 24;

// The size of one element of `dtype` (and whether it is a float).
size_t item_size(tinker_public::DType dtype, const std::string& where,
                 bool* is_float) {
  *is_float = dtype == tinker_public::DTYPE_FLOAT32;
  switch (dtype) {
    case tinker_public::DTYPE_FLOAT32:
    case tinker_public::DTYPE_INT32:
      return 4;
    case tinker_public::DTYPE_INT64:
      return 8;
    default:
      throw UsageError(where + " has dtype " +
                       tinker_public::DType_Name(dtype) +
                       ": expected DTYPE_FLOAT32, DTYPE_INT64 or DTYPE_INT32");
  }
}

// `bytes`, a whole number of `item`-byte elements, into v's ints or floats.
void read_elements(const std::string& bytes, size_t item, TensorValue* v) {
  const size_t n = bytes.size() / item;
  if (v->is_float) {
    v->floats.resize(n);
    std::memcpy(v->floats.data(), bytes.data(), bytes.size());
  } else if (item == 8) {
    v->ints.resize(n);
    std::memcpy(v->ints.data(), bytes.data(), bytes.size());
  } else {
    std::vector<int32_t> narrow(n);
    std::memcpy(narrow.data(), bytes.data(), bytes.size());
    v->ints.assign(narrow.begin(), narrow.end());
  }
}

std::vector<int64_t> int64s(const std::string& bytes, const std::string& where,
                            const std::string& what) {
  if (bytes.size() % 8 != 0)
    throw UsageError(where + "'s sparse_csr." + what + " holds " +
                     std::to_string(bytes.size()) +
                     " bytes, not a whole number of int64s");
  std::vector<int64_t> out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Note [Sparse loss_fn_inputs]: the SDK sends a 2-D torch `target_tokens`
// or `weights` as CSR when that is smaller (Datum's _SPARSE_ELIGIBLE_KEYS,
// TensorData.from_torch_sparse with its pad_value 0: the cookbook's
// self-distillation sends [T, K] soft-target weights that way). Here it is
// made dense, every unlisted element 0, after the invariants torch's
// check_invariants holds: a 2-D shape, crow_indices of rows + 1 entries
// from 0 to nnz, never decreasing, and each row's column indices
// increasing and within the columns.
void densify_csr(const tinker_public::SparseCsr& csr, const std::string& where,
                 TensorValue* v) {
  if (v->shape.size() != 2)
    throw UsageError(where + " is a sparse_csr tensor of shape " +
                     [&] {
                       std::string s = "[";
                       for (size_t k = 0; k < v->shape.size(); ++k)
                         s += (k ? ", " : "") + std::to_string(v->shape[k]);
                       return s + "]";
                     }() +
                     ": a CSR tensor must have 2 dimensions");
  const int64_t rows = v->shape[0], cols = v->shape[1];
  const std::vector<int64_t> crow = int64s(csr.crow_indices(), where,
                                           "crow_indices");
  const std::vector<int64_t> col = int64s(csr.col_indices(), where,
                                          "col_indices");
  const int64_t nnz = v->numel();
  auto bad = [&](const std::string& why) {
    return UsageError(where + " is not a consistent CSR tensor of shape [" +
                      std::to_string(rows) + ", " + std::to_string(cols) +
                      "]: " + why +
                      ". Fix: build it with TensorData.from_torch_sparse or "
                      "send it dense");
  };
  if (static_cast<int64_t>(crow.size()) != rows + 1)
    throw bad("crow_indices has " + std::to_string(crow.size()) +
              " entries, not rows + 1 = " + std::to_string(rows + 1));
  if (static_cast<int64_t>(col.size()) != nnz)
    throw bad("col_indices has " + std::to_string(col.size()) +
              " entries but values has " + std::to_string(nnz));
  if (crow.front() != 0 || crow.back() != nnz)
    throw bad("crow_indices must run from 0 to the number of values " +
              std::to_string(nnz));
  // Never decreasing from 0 to nnz, so every row's range is within col.
  for (int64_t r = 0; r < rows; ++r)
    if (crow[r + 1] < crow[r])
      throw bad("crow_indices decreases at row " + std::to_string(r));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = crow[r]; k < crow[r + 1]; ++k)
      if (col[k] < 0 || col[k] >= cols || (k > crow[r] && col[k] <= col[k - 1]))
        throw bad("row " + std::to_string(r) +
                  "'s col_indices must increase within [0, " +
                  std::to_string(cols) + ")");
  }
  // rows * cols is at most kMaxSparseElements (checked by the caller).
  TensorValue dense;
  dense.is_float = v->is_float;
  dense.shape = v->shape;
  if (v->is_float)
    dense.floats.assign(static_cast<size_t>(rows * cols), 0.0f);
  else
    dense.ints.assign(static_cast<size_t>(rows * cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = crow[r]; k < crow[r + 1]; ++k) {
      const size_t at = static_cast<size_t>(r * cols + col[k]);
      if (v->is_float)
        dense.floats[at] = v->floats[k];
      else
        dense.ints[at] = v->ints[k];
    }
  *v = std::move(dense);
}

TensorValue decode_tensor(const tinker_public::Tensor& t,
                          const std::string& where) {
  TensorValue v;
  v.shape.assign(t.shape().begin(), t.shape().end());
  // The element count without wrapping: a shape of [2^61] int64s once
  // needed 2^64 = 0 bytes, matched an empty tensor, and then a vector of
  // 2^61 elements failed (found by //tools/tinker:request_property_test).
  uint64_t numel = 1;
  bool too_large = false;
  for (int64_t d : v.shape)
    if (d < 0) throw UsageError(where + " has a negative dimension in its shape");
  if (std::find(v.shape.begin(), v.shape.end(), 0) != v.shape.end()) {
    numel = 0;
  } else {
    for (int64_t d : v.shape)
      too_large = too_large || __builtin_mul_overflow(
                                   numel, static_cast<uint64_t>(d), &numel);
  }
  const size_t item = item_size(t.dtype(), where, &v.is_float);
  if (t.encoding_case() == tinker_public::Tensor::kSparseCsr) {
    const std::string& values = t.sparse_csr().values();
    if (values.size() % item != 0)
      throw UsageError(where + "'s sparse_csr.values holds " +
                       std::to_string(values.size()) +
                       " bytes, not a whole number of " +
                       tinker_public::DType_Name(t.dtype()) + " elements");
    // Made dense here, so a few bytes could ask for gigabytes: past 2^24
    // elements (a context of 32768 times 512 targets) it is refused first.
    if (too_large || numel > kMaxSparseElements)
      throw UsageError(where + " is a sparse_csr tensor of more than " +
                       std::to_string(kMaxSparseElements) +
                       " elements once dense. Fix: fewer targets per "
                       "position, or a shorter datum");
    read_elements(values, item, &v);
    densify_csr(t.sparse_csr(), where, &v);
    return v;
  }
  const std::string& bytes = t.dense();
  if (v.shape.empty()) numel = bytes.size() / item;
  uint64_t need = 0;
  too_large = too_large || __builtin_mul_overflow(numel, item, &need);
  if (too_large || bytes.size() != need)
    throw UsageError(
        where + " holds " + std::to_string(bytes.size()) +
        " bytes but its shape and dtype need " +
        (too_large ? std::string("2^64 or more") : std::to_string(need)));
  if (v.shape.empty()) v.shape = {static_cast<int64_t>(numel)};
  read_elements(bytes, item, &v);
  return v;
}

// One span of a datum's provenance.
ProvenanceSpanIn decode_span(const tinker_public::ProvenanceSpan& s,
                             const std::string& where) {
  ProvenanceSpanIn out;
  std::string id;
  int64_t offset = 0, length = 0;
  switch (s.span_case()) {
    case tinker_public::ProvenanceSpan::kPromptTokens:
      id = s.prompt_tokens().sequence_id();
      offset = s.prompt_tokens().offset();
      length = s.prompt_tokens().length();
      break;
    case tinker_public::ProvenanceSpan::kSampledTokens:
      out.sampled = true;
      id = s.sampled_tokens().sequence_id();
      offset = s.sampled_tokens().offset();
      length = s.sampled_tokens().length();
      break;
    default:
      throw UsageError(where + " is neither a prompt_tokens nor a "
                       "sampled_tokens span");
  }
  if (id.empty()) throw UsageError(where + " has an empty sequence_id");
  if (offset < 0 || length < 0)
    throw UsageError(where + " has offset " + std::to_string(offset) +
                     " and length " + std::to_string(length) +
                     "; both must be >= 0");
  out.sequence_id = std::move(id);
  out.offset = offset;
  out.length = length;
  return out;
}

}  // namespace

int64_t TensorValue::numel() const {
  return static_cast<int64_t>(is_float ? floats.size() : ints.size());
}

bool peek_forward_backward(const std::string& body, std::string* model_id,
                           int32_t* seq_id) {
  tinker_public::ForwardBackwardRequest req;
  if (!req.ParseFromString(body)) return false;
  *model_id = req.model_id();
  *seq_id = req.seq_id();
  return true;
}

ForwardBackwardIn decode_forward_backward(const std::string& body) {
  tinker_public::ForwardBackwardRequest req;
  if (!req.ParseFromString(body))
    throw UsageError("the forward_backward body is not a valid "
                     "tinker_public.ForwardBackwardRequest protobuf");
  ForwardBackwardIn in;
  in.model_id = req.model_id();
  in.seq_id = req.seq_id();
  in.loss_fn = req.loss_fn();
  in.forward_only = req.forward_only();
  for (const auto& kv : req.loss_fn_config()) in.loss_fn_config[kv.first] = kv.second;
  for (const auto& kv : req.loss_fn_config_v2()) {
    if (kv.second.value_case() == tinker_public::LossConfigValue::kText)
      throw UsageError("loss_fn_config['" + kv.first + "'] is the string '" +
                       kv.second.text() + "': the built-in losses take "
                       "numbers only");
    in.loss_fn_config[kv.first] = kv.second.number();
  }
  for (int i = 0; i < req.data_size(); ++i) {
    const tinker_public::Datum& d = req.data(i);
    DatumIn out;
    for (int c = 0; c < d.model_input_size(); ++c) {
      const tinker_public::Chunk& chunk = d.model_input(c);
      if (chunk.chunk_case() != tinker_public::Chunk::kEncodedText)
        throw UsageError("data[" + std::to_string(i) + "].model_input[" +
                         std::to_string(c) + "] is not an encoded_text chunk "
                         "(images and audio are not served by this server)");
      const std::string& t = chunk.encoded_text().tokens();
      if (t.size() % 4 != 0)
        throw UsageError("data[" + std::to_string(i) + "].model_input[" +
                         std::to_string(c) + "].tokens holds " +
                         std::to_string(t.size()) +
                         " bytes, not a whole number of int32 tokens");
      std::vector<int32_t> tokens(t.size() / 4);
      std::memcpy(tokens.data(), t.data(), t.size());
      out.tokens.insert(out.tokens.end(), tokens.begin(), tokens.end());
    }
    for (const auto& kv : d.loss_fn_inputs())
      out.inputs[kv.first] =
          decode_tensor(kv.second, datum_field(static_cast<size_t>(i), kv.first));
    const std::string at = "data[" + std::to_string(i) + "]";
    if ((d.model_input_spans_size() > 0) != (d.loss_fn_input_spans_size() > 0))
      throw UsageError(at + " has " +
                       (d.model_input_spans_size() > 0 ? "model_input_spans"
                                                       : "loss_fn_input_spans") +
                       " alone: provenance comes as a pair "
                       "(Datum.with_provenance sets both)");
    out.has_provenance = d.model_input_spans_size() > 0;
    for (int k = 0; k < d.model_input_spans_size(); ++k)
      out.input_spans.push_back(decode_span(
          d.model_input_spans(k),
          at + ".model_input_spans[" + std::to_string(k) + "]"));
    for (int k = 0; k < d.loss_fn_input_spans_size(); ++k)
      out.target_spans.push_back(decode_span(
          d.loss_fn_input_spans(k),
          at + ".loss_fn_input_spans[" + std::to_string(k) + "]"));
    in.data.push_back(std::move(out));
  }
  return in;
}

std::string encode_forward_backward_output(
    const std::vector<DatumOut>& data,
    const std::map<std::string, double>& metrics) {
  tinker_public::ForwardBackwardOutput out;
  out.set_loss_fn_output_type("ArrayRecord");
  // One record per run of datums with the same trailing shape: a
  // BatchedTensor has one.
  for (size_t begin = 0; begin < data.size();) {
    size_t end = begin + 1;
    while (end < data.size() && data[end].k == data[begin].k) ++end;
    tinker_public::ArrayRecord* rec = out.add_loss_fn_outputs();
    rec->set_type_tag("ArrayRecord");
    rec->set_num_datums(static_cast<int64_t>(end - begin));
    auto field = [&](const char* name, std::vector<float> DatumOut::*member) {
      tinker_public::BatchedTensor bt;
      bt.set_dtype(tinker_public::DTYPE_FLOAT32);
      if (data[begin].k > 0) bt.add_trailing_shape(data[begin].k);
      std::string bytes;
      std::vector<int64_t> offsets = {0};
      for (size_t i = begin; i < end; ++i) {
        const std::vector<float>& v = data[i].*member;
        bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
        offsets.push_back(static_cast<int64_t>(bytes.size()));
      }
      bt.set_data(bytes);
      bt.set_offsets(std::string(reinterpret_cast<const char*>(offsets.data()),
                                 offsets.size() * sizeof(int64_t)));
      (*rec->mutable_fields())[name] = bt;
    };
    field("logprobs", &DatumOut::logprobs);
    field("elementwise_loss", &DatumOut::elementwise_loss);
    begin = end;
  }
  for (const auto& kv : metrics) (*out.mutable_metrics())[kv.first] = kv.second;
  return out.SerializeAsString();
}

const std::vector<std::string>& supported_losses() {
  static const std::vector<std::string> kLosses = {
      "cross_entropy", "importance_sampling", "ppo",  "cispo",
      "dro",           "gspo",                "stable_reinforce"};
  return kLosses;
}

}  // namespace tinker
}  // namespace zerostep
