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

TensorValue decode_tensor(const tinker_public::Tensor& t,
                          const std::string& where) {
  if (t.encoding_case() == tinker_public::Tensor::kSparseCsr)
    throw UsageError(where + " is a sparse_csr tensor: this server reads "
                     "dense tensors only. Fix: send it dense (a 1-D numpy "
                     "array or TensorData)");
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
  size_t item = 0;
  switch (t.dtype()) {
    case tinker_public::DTYPE_FLOAT32:
      v.is_float = true;
      item = 4;
      break;
    case tinker_public::DTYPE_INT64:
      item = 8;
      break;
    case tinker_public::DTYPE_INT32:
      item = 4;
      break;
    default:
      throw UsageError(where + " has dtype " +
                       tinker_public::DType_Name(t.dtype()) +
                       ": expected DTYPE_FLOAT32, DTYPE_INT64 or DTYPE_INT32");
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
  if (v.is_float) {
    v.floats.resize(static_cast<size_t>(numel));
    std::memcpy(v.floats.data(), bytes.data(), bytes.size());
  } else if (item == 8) {
    v.ints.resize(static_cast<size_t>(numel));
    std::memcpy(v.ints.data(), bytes.data(), bytes.size());
  } else {
    std::vector<int32_t> narrow(static_cast<size_t>(numel));
    std::memcpy(narrow.data(), bytes.data(), bytes.size());
    v.ints.assign(narrow.begin(), narrow.end());
  }
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
