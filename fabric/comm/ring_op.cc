#include "fabric/comm/ring_op.h"

#include <algorithm>
#include <cstring>

#include "fabric/comm/communicator.h"

namespace cofab::comm {
namespace {

using Mode = RingPlan::Mode;

class RingOp final : public CollectiveOp {
 public:
  RingOp(Communicator& comm, const OpSignature& sig, Deadline deadline, const RingPlan& plan)
      : CollectiveOp(comm, sig, deadline),
        plan_(plan),
        es_(dtypeSize(sig.dtype)),
        n_(comm.size()),
        r_(comm.rank()),
        left_((comm.rank() + comm.size() - 1) % comm.size()),
        right_((comm.rank() + 1) % comm.size()) {
    const size_t perRank = plan.mode == Mode::kAllreduce ? 0
                           : plan.mode == Mode::kReduceScatter ? plan.out.count
                                                               : plan.in.count;
    total_ = plan.mode == Mode::kAllreduce ? plan.in.count : perRank * static_cast<size_t>(n_);
    size_t maxBlock = 0;
    for (int b = 0; b < n_; ++b) maxBlock = std::max(maxBlock, blockCount(b));
    const size_t chunkElems = std::max<size_t>(1, plan.chunkBytes / es_);
    k_ = static_cast<uint32_t>(std::max<size_t>(1, (maxBlock + chunkElems - 1) / chunkElems));
    slotBytes_ = ((maxBlock + k_ - 1) / k_) * es_;
    rsStages_ = plan.mode == Mode::kAllgather ? 0 : n_ - 1;
    const int agStages = plan.mode == Mode::kReduceScatter ? 0 : n_ - 1;
    stages_ = rsStages_ + agStages;
    messages_ = static_cast<uint32_t>(stages_) * k_;
    window_ = static_cast<uint32_t>(std::max(1, plan.window));
  }

 protected:
  void begin() override {
    if (n_ == 1) {
      localOnly();
      finish();
      return;
    }
    size_t scratchBytes = static_cast<size_t>(window_) * slotBytes_;
    if (plan_.mode == Mode::kReduceScatter && rsStages_ > 1) {
      fwdOffset_ = scratchBytes;
      scratchBytes += static_cast<size_t>(rsStages_ - 1) * blockCount(0) * es_;
    }
    StatusOr<uint8_t*> scratch = comm().scratch(scratchBytes);
    if (!scratch.ok()) {
      fail(scratch.status());  // before anything was posted: nothing to wait for
      return;
    }
    scratch_ = *scratch;
    postRecvs();
    for (uint32_t j = 0; j < k_; ++j) {
      sendTo(right_, j, sendSource(0, j), chunkCount(sendBlock(0), j) * es_);
    }
    if (plan_.mode == Mode::kAllgather) {
      uint8_t* mine = out(r_, 0);
      if (mine != plan_.in.data) std::memcpy(mine, plan_.in.data, plan_.in.count * es_);
    }
  }

  void onReceived(int /*peer*/, uint32_t m) override {
    const int s = static_cast<int>(m / k_);
    const uint32_t j = m % k_;
    const int b = recvBlock(s);
    const size_t cnt = chunkCount(b, j);
    if (s < rsStages_) {
      const uint8_t* slot = scratch_ + static_cast<size_t>(m % window_) * slotBytes_;
      const bool last = s == rsStages_ - 1;
      uint8_t* dst = plan_.mode == Mode::kAllreduce ? out(b, j)
                     : last                         ? out(b, j)
                                                    : fwd(s, j);
      const OpSignature& sig = signature();
      if (avgPrescaled(sig.dtype, sig.reduceOp)) {
        // This rank's block enters divided by n; what arrives is the sender's raw block at stage
        // 0 and an already divided partial sum after it. No division at the end.
        const float inv = 1.0f / static_cast<float>(n_);
        scaledSumF16(dst, in(b, j), inv, slot, s == 0 ? inv : 1.0f, cnt);
      } else if (last) {
        reduceFinal(sig.dtype, sig.reduceOp, n_, dst, in(b, j), slot, cnt);
      } else {
        reduce(sig.dtype, sig.reduceOp, dst, in(b, j), slot, cnt);
      }
    }
    ++received_;
    if (s + 1 < stages_) sendTo(right_, m + k_, sendSource(s + 1, j), cnt * es_);
    postRecvs();
    if (received_ == messages_) finish();
  }

  uint32_t messagesFrom(int) const override { return messages_; }
  uint32_t messagesTo(int) const override { return messages_; }

 private:
  int mod(int x) const { return ((x % n_) + n_) % n_; }
  // Stage s sends block sendBlock(s) and receives block sendBlock(s + 1): what arrives is what
  // is forwarded next. Reduce-scatter stages end with rank r owning block r.
  int sendBlock(int s) const {
    return s < rsStages_ ? mod(r_ - s - 1) : mod(r_ - (s - rsStages_));
  }
  int recvBlock(int s) const { return sendBlock(s + 1); }

  size_t blockOffset(int b) const {
    if (plan_.mode == Mode::kAllreduce) {
      return static_cast<size_t>((static_cast<unsigned __int128>(total_) * b) / n_);
    }
    return static_cast<size_t>(b) * (total_ / static_cast<size_t>(n_));
  }
  size_t blockCount(int b) const { return blockOffset(b + 1) - blockOffset(b); }
  // Chunks of a block are balanced; the same arithmetic runs on every rank.
  size_t chunkStart(int b, uint32_t j) const { return blockCount(b) * j / k_; }
  size_t chunkCount(int b, uint32_t j) const { return chunkStart(b, j + 1) - chunkStart(b, j); }

  const uint8_t* in(int b, uint32_t j) const {
    const size_t elem = plan_.mode == Mode::kAllgather ? chunkStart(b, j)
                                                       : blockOffset(b) + chunkStart(b, j);
    return static_cast<const uint8_t*>(plan_.in.data) + elem * es_;
  }
  uint8_t* out(int b, uint32_t j) const {
    const size_t elem = plan_.mode == Mode::kReduceScatter ? chunkStart(b, j)
                                                           : blockOffset(b) + chunkStart(b, j);
    return static_cast<uint8_t*>(plan_.out.data) + elem * es_;
  }
  uint8_t* fwd(int s, uint32_t j) const {
    return scratch_ + fwdOffset_ + (static_cast<size_t>(s) * blockCount(0) + chunkStart(0, j)) * es_;
  }

  // Where the data sent at stage s lives: the input at stage 0, else wherever stage s - 1 put
  // what it received.
  const void* sendSource(int s, uint32_t j) const {
    const int b = sendBlock(s);
    if (s == 0) return in(b, j);
    if (s - 1 < rsStages_ && plan_.mode == Mode::kReduceScatter) return fwd(s - 1, j);
    return out(b, j);
  }

  void postRecvs() {
    while (posted_ < messages_ && posted_ < received_ + window_) {
      const uint32_t m = posted_++;
      const int s = static_cast<int>(m / k_);
      const uint32_t j = m % k_;
      const int b = recvBlock(s);
      void* dest = s < rsStages_ ? scratch_ + static_cast<size_t>(m % window_) * slotBytes_
                                 : static_cast<void*>(out(b, j));
      recvFrom(left_, m, dest, chunkCount(b, j) * es_);
    }
  }

  void localOnly() {
    const OpSignature& sig = signature();
    const size_t bytes = plan_.out.count * es_;
    if (plan_.out.data != plan_.in.data && bytes > 0) {
      std::memcpy(plan_.out.data, plan_.in.data, bytes);
    }
    (void)sig;
  }

  const RingPlan plan_;
  const size_t es_;
  const int n_, r_, left_, right_;
  size_t total_ = 0;  // elements over all blocks
  uint32_t k_ = 1;    // chunks per block
  size_t slotBytes_ = 0;
  int rsStages_ = 0, stages_ = 0;
  uint32_t messages_ = 0, window_ = 1;
  uint8_t* scratch_ = nullptr;
  size_t fwdOffset_ = 0;
  uint32_t posted_ = 0, received_ = 0;
};

}  // namespace

std::shared_ptr<CollectiveOp> makeRingOp(Communicator& comm, const OpSignature& signature,
                                         Deadline deadline, const RingPlan& plan) {
  return std::make_shared<RingOp>(comm, signature, deadline, plan);
}

}  // namespace cofab::comm
