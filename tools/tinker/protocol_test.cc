#include "tools/tinker/protocol.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "tools/tinker/tinker_public.pb.h"

namespace zerostep {
namespace tinker {
namespace {

// A request of one datum whose target_tokens are int64s of `shape` held
// in `bytes`.
std::string request_with_targets(
    const std::vector<int64_t>& shape, const std::string& bytes,
    tinker_public::DType dtype = tinker_public::DTYPE_INT64) {
  tinker_public::ForwardBackwardRequest req;
  req.set_model_id("m");
  req.set_loss_fn("cross_entropy");
  tinker_public::Datum* d = req.add_data();
  const int32_t token = 7;
  d->add_model_input()->mutable_encoded_text()->set_tokens(
      std::string(reinterpret_cast<const char*>(&token), 4));
  tinker_public::Tensor& t = (*d->mutable_loss_fn_inputs())["target_tokens"];
  t.set_dtype(dtype);
  for (int64_t s : shape) t.add_shape(s);
  t.set_dense(bytes);
  return req.SerializeAsString();
}

std::string usage_error(const std::string& body) {
  try {
    decode_forward_backward(body);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// A shape whose byte count wrapped around 2^64 to the bytes sent (none)
// passed the size check, and the decoder then asked for a vector of 2^61
// elements (std::length_error: the server's fault, not the client's).
// Found by //tools/tinker:request_property_test.
TEST(DecodeForwardBackward, AShapeWhoseSizeOverflowsIsRefused) {
  const int64_t k61 = int64_t{1} << 61, k62 = int64_t{1} << 62;
  for (const auto& [shape, dtype] :
       std::vector<std::pair<std::vector<int64_t>, tinker_public::DType>>{
           {{k61}, tinker_public::DTYPE_INT64},
           {{int64_t{1} << 31, int64_t{1} << 30}, tinker_public::DTYPE_INT64},
           {{k62}, tinker_public::DTYPE_FLOAT32},
           {{k62, k62, 4}, tinker_public::DTYPE_INT32}}) {
    const std::string e = usage_error(request_with_targets(shape, "", dtype));
    EXPECT_NE(e.find("data[0].loss_fn_inputs['target_tokens'] holds 0 bytes "
                     "but its shape and dtype need 2^64 or more"),
              std::string::npos)
        << e;
  }
}

TEST(DecodeForwardBackward, AZeroDimensionMakesAnEmptyTensor) {
  const int64_t k62 = int64_t{1} << 62;
  const ForwardBackwardIn in =
      decode_forward_backward(request_with_targets({k62, k62, 0}, ""));
  const TensorValue& v = in.data.at(0).inputs.at("target_tokens");
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ(v.shape, (std::vector<int64_t>{k62, k62, 0}));
}

TEST(DecodeForwardBackward, ShapeAndBytesMustAgree) {
  const std::vector<int64_t> ids = {3, -1, 255};
  const std::string bytes(reinterpret_cast<const char*>(ids.data()), 24);
  const ForwardBackwardIn in =
      decode_forward_backward(request_with_targets({3}, bytes));
  EXPECT_EQ(in.data.at(0).inputs.at("target_tokens").ints, ids);
  EXPECT_EQ(decode_forward_backward(request_with_targets({}, bytes))
                .data.at(0)
                .inputs.at("target_tokens")
                .shape,
            std::vector<int64_t>{3});
  EXPECT_NE(usage_error(request_with_targets({4}, bytes))
                .find("holds 24 bytes but its shape and dtype need 32"),
            std::string::npos);
  EXPECT_NE(usage_error(request_with_targets({-3}, bytes))
                .find("has a negative dimension"),
            std::string::npos);
}

// A request whose `weights` are float32s of `shape` in the SDK's CSR form
// (TensorData.from_torch_sparse, pad 0).
std::string request_with_csr_weights(const std::vector<int64_t>& shape,
                                     const std::vector<float>& values,
                                     const std::vector<int64_t>& crow,
                                     const std::vector<int64_t>& col) {
  tinker_public::ForwardBackwardRequest req;
  req.ParseFromString(request_with_targets({}, std::string(8, '\0')));
  tinker_public::Tensor& t =
      (*req.mutable_data(0)->mutable_loss_fn_inputs())["weights"];
  t.set_dtype(tinker_public::DTYPE_FLOAT32);
  for (int64_t s : shape) t.add_shape(s);
  auto bytes = [](const auto& v) {
    return std::string(reinterpret_cast<const char*>(v.data()),
                       v.size() * sizeof(v[0]));
  };
  t.mutable_sparse_csr()->set_values(bytes(values));
  t.mutable_sparse_csr()->set_crow_indices(bytes(crow));
  t.mutable_sparse_csr()->set_col_indices(bytes(col));
  return req.SerializeAsString();
}

// Note [Sparse loss_fn_inputs]: what torch.Tensor.to_sparse_csr() of
// [[0, 0.5, 0], [0, 0, 0], [0.25, 0, 0.75]] gives, made dense again.
TEST(DecodeForwardBackward, ASparseCsrTensorIsMadeDense) {
  const ForwardBackwardIn in = decode_forward_backward(
      request_with_csr_weights({3, 3}, {0.5f, 0.25f, 0.75f}, {0, 1, 1, 3},
                               {1, 0, 2}));
  const TensorValue& w = in.data.at(0).inputs.at("weights");
  EXPECT_TRUE(w.is_float);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(w.floats, (std::vector<float>{0, 0.5f, 0, 0, 0, 0, 0.25f, 0,
                                          0.75f}));
  // All zeros: no values at all.
  EXPECT_EQ(decode_forward_backward(
                request_with_csr_weights({2, 4}, {}, {0, 0, 0}, {}))
                .data.at(0)
                .inputs.at("weights")
                .floats,
            std::vector<float>(8, 0.0f));
}

TEST(DecodeForwardBackward, AnInconsistentSparseCsrTensorIsRefused) {
  const std::string at = "data[0].loss_fn_inputs['weights'] ";
  const std::string csr = at + "is not a consistent CSR tensor of shape ";
  const std::vector<float> two = {1, 2};
  for (const auto& [body, want] :
       std::vector<std::pair<std::string, std::string>>{
           {request_with_csr_weights({3}, two, {0, 2}, {0, 1}),
            at + "is a sparse_csr tensor of shape [3]: a CSR tensor must "
                 "have 2 dimensions"},
           {request_with_csr_weights({2, 3}, two, {0, 2}, {0, 1}),
            csr + "[2, 3]: crow_indices has 2 entries, not rows + 1 = 3"},
           {request_with_csr_weights({2, 3}, two, {0, 1, 2}, {0}),
            csr + "[2, 3]: col_indices has 1 entries but values has 2"},
           {request_with_csr_weights({2, 3}, two, {0, 1, 1}, {0, 1}),
            csr + "[2, 3]: crow_indices must run from 0 to the number of "
                  "values 2"},
           {request_with_csr_weights({2, 3}, two, {0, 2, 1}, {0, 1}),
            csr + "[2, 3]: crow_indices must run from 0"},
           // Row 0 would read 3 column indices of 2.
           {request_with_csr_weights({2, 3}, two, {0, 3, 2}, {0, 1}),
            csr + "[2, 3]: crow_indices decreases at row 1"},
           {request_with_csr_weights({2, 3}, two, {0, 2, 2}, {1, 1}),
            csr + "[2, 3]: row 0's col_indices must increase within [0, 3)"},
           {request_with_csr_weights({2, 3}, two, {0, 1, 2}, {0, 3}),
            csr + "[2, 3]: row 1's col_indices must increase within [0, 3)"},
           {request_with_csr_weights({4096, 8192}, {}, {0}, {}),
            at + "is a sparse_csr tensor of more than 16777216 elements once "
                 "dense"}}) {
    const std::string e = usage_error(body);
    EXPECT_EQ(e.rfind(want, 0), 0u) << e << "\nwant: " << want;
  }
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
