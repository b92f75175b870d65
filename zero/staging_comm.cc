#include "zero/staging_comm.h"

#include "common/errors.h"

namespace zerostep {

StagingCommunicator::StagingCommunicator(Communicator* inner, Kernels* kernels)
    : inner_(inner), k_(kernels) {
  ZS_CHECK(inner_ != nullptr && k_ != nullptr);
}

Buffer StagingCommunicator::stage(Buffer b, std::vector<float>* host,
                                  bool read) {
  if (!b.device) return b;
  if (b.dtype != DType::kFloat32)
    throw UsageError(std::string("StagingCommunicator: a device buffer of ") +
                     to_string(b.dtype) +
                     "; the stages' device buffers are float32");
  if (host->size() < b.numel) host->resize(b.numel);
  if (read) k_->download(host->data(), static_cast<const float*>(b.data), b.numel);
  return Buffer::of(host->data(), b.numel);
}

void StagingCommunicator::unstage(Buffer device, Buffer host) {
  if (!device.device) return;
  k_->upload(static_cast<float*>(device.data),
             static_cast<const float*>(host.data), device.numel);
}

void StagingCommunicator::all_reduce(Buffer buf, const AllReduceOptions& opts) {
  const Buffer h = stage(buf, &in_, true);
  inner_->all_reduce(h, opts);
  unstage(buf, h);
}

void StagingCommunicator::reduce_scatter(Buffer input, Buffer output,
                                         const ReduceScatterOptions& opts) {
  if (input.device || output.device) refuse_accumulate("staging", rank(), opts);
  const Buffer hi = stage(input, &in_, true);
  const Buffer ho = stage(output, &out_, false);
  inner_->reduce_scatter(hi, ho, opts);
  unstage(output, ho);
}

void StagingCommunicator::all_gather(Buffer input, Buffer output,
                                     const AllGatherOptions& opts) {
  // The input may be this rank's chunk of the output: it is read before
  // anything is written back.
  const Buffer hi = stage(input, &in_, true);
  const Buffer ho = stage(output, &out_, false);
  inner_->all_gather(hi, ho, opts);
  unstage(output, ho);
}

namespace {
// Uploads a staged output once the wrapped collective completed. Owns its
// host buffers: several may be in flight at once.
class StagedWork final : public Work {
 public:
  StagedWork(std::shared_ptr<Work> inner, std::vector<float> in,
             std::vector<float> out, Buffer device_out, Kernels* k)
      : inner_(std::move(inner)),
        in_(std::move(in)),
        out_(std::move(out)),
        device_out_(device_out),
        k_(k) {}
  void wait() override {
    inner_->wait();
    if (done_) return;
    done_ = true;
    if (device_out_.device)
      k_->upload(static_cast<float*>(device_out_.data), out_.data(),
                 device_out_.numel);
  }
 private:
  std::shared_ptr<Work> inner_;
  std::vector<float> in_, out_;
  Buffer device_out_;
  Kernels* k_;
  bool done_ = false;
};
}  // namespace

std::shared_ptr<Work> StagingCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  if (!input.device && !output.device)
    return inner_->reduce_scatter_async(input, output, opts);
  refuse_accumulate("staging", rank(), opts);
  std::vector<float> in, out;
  const Buffer hi = stage(input, &in, true);
  const Buffer ho = stage(output, &out, false);
  auto inner = inner_->reduce_scatter_async(hi, ho, opts);
  // The vectors move into the work; their heap storage (which the
  // collective reads and writes) does not move.
  return std::make_shared<StagedWork>(std::move(inner), std::move(in),
                                      std::move(out), output, k_);
}

std::shared_ptr<Work> StagingCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  if (!buf.device) return inner_->all_reduce_async(buf, opts);
  std::vector<float> host;
  const Buffer h = stage(buf, &host, true);
  auto inner = inner_->all_reduce_async(h, opts);
  return std::make_shared<StagedWork>(std::move(inner), std::vector<float>(),
                                      std::move(host), buf, k_);
}

void StagingCommunicator::broadcast(Buffer buf, const BroadcastOptions& opts) {
  const Buffer h = stage(buf, &in_, true);
  inner_->broadcast(h, opts);
  unstage(buf, h);
}

}  // namespace zerostep
