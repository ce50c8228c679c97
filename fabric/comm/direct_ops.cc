#include "fabric/comm/direct_ops.h"

#include <algorithm>
#include <cstring>

#include "fabric/comm/communicator.h"

namespace cofab::comm {
namespace {

// Every rank sends `in` to every peer; received inputs land in scratch (allreduce) or in the
// output (allgather); barrier sends nothing but headers.
class ExchangeOp final : public CollectiveOp {
 public:
  enum class Kind : uint8_t { kAllreduce, kAllgather, kBarrier };
  ExchangeOp(Communicator& comm, const OpSignature& sig, Deadline deadline, Kind kind,
             const TensorView& in, const TensorView& out)
      : CollectiveOp(comm, sig, deadline), kind_(kind), in_(in), out_(out) {}

 protected:
  void begin() override {
    const size_t bytes = in_.bytes();
    const int n = size();
    const int r = rank();
    if (kind_ == Kind::kAllreduce && n > 1) {
      // One slot per rank; the own slot holds a copy of the input when reducing in place, so
      // that writing the output never overwrites an input still to be read.
      StatusOr<uint8_t*> slots = comm().scratch(bytes * static_cast<size_t>(n));
      if (!slots.ok()) {
        fail(slots.status());  // before anything was posted: nothing to wait for
        return;
      }
      slots_ = *slots;
    }
    for (int i = 1; i < n; ++i) {
      const int p = (r + i) % n;  // staggered so ranks do not all hit rank 0 first
      recvFrom(p, 0, recvDest(p), kind_ == Kind::kBarrier ? 0 : bytes);
    }
    for (int i = 1; i < n; ++i) {
      const int p = (r + i) % n;
      sendTo(p, 0, in_.data, kind_ == Kind::kBarrier ? 0 : bytes);
    }
    pending_ = 2 * (n - 1);
    if (kind_ == Kind::kAllgather) {
      uint8_t* mine = static_cast<uint8_t*>(out_.data) + static_cast<size_t>(r) * bytes;
      if (mine != in_.data && bytes > 0) std::memcpy(mine, in_.data, bytes);
    }
    if (pending_ == 0) complete();
  }
  void onReceived(int, uint32_t) override {
    if (--pending_ == 0) complete();
  }
  void onSent(int, uint32_t) override {
    if (--pending_ == 0) complete();
  }
  uint32_t messagesFrom(int) const override { return 1; }
  uint32_t messagesTo(int) const override { return 1; }

 private:
  void* recvDest(int p) const {
    if (kind_ == Kind::kBarrier) return nullptr;
    if (kind_ == Kind::kAllgather) {
      return static_cast<uint8_t*>(out_.data) + static_cast<size_t>(p) * in_.bytes();
    }
    return slots_ + static_cast<size_t>(p) * in_.bytes();
  }

  // All messages are in and all sends are out, so the input may be overwritten now.
  void complete() {
    if (kind_ == Kind::kAllreduce) reduceAll();
    finish();
  }

  void reduceAll() {
    const int n = size();
    const size_t count = in_.count;
    const size_t bytes = in_.bytes();
    const OpSignature& sig = signature();
    if (n == 1) {
      if (out_.data != in_.data && bytes > 0) std::memcpy(out_.data, in_.data, bytes);
      return;
    }
    const void* own = in_.data;
    if (out_.data == in_.data && bytes > 0) {
      uint8_t* copy = slots_ + static_cast<size_t>(rank()) * bytes;
      std::memcpy(copy, in_.data, bytes);
      own = copy;
    }
    auto src = [&](int q) -> const void* {
      return q == rank() ? own : slots_ + static_cast<size_t>(q) * bytes;
    };
    // Rank order on every rank: the same operations in the same order give the same bits.
    const float inv = 1.0f / static_cast<float>(n);
    for (int q = 1; q < n; ++q) {
      const void* acc = q == 1 ? src(0) : out_.data;
      if (avgPrescaled(sig.dtype, sig.reduceOp)) {  // every contribution enters divided by n
        scaledSumF16(out_.data, acc, q == 1 ? inv : 1.0f, src(q), inv, count);
      } else if (q == n - 1) {
        reduceFinal(sig.dtype, sig.reduceOp, n, out_.data, acc, src(q), count);
      } else {
        reduce(sig.dtype, sig.reduceOp, out_.data, acc, src(q), count);
      }
    }
  }

  const Kind kind_;
  const TensorView in_;
  const TensorView out_;
  uint8_t* slots_ = nullptr;
  int pending_ = 0;
};

class BroadcastOp final : public CollectiveOp {
 public:
  BroadcastOp(Communicator& comm, const OpSignature& sig, Deadline deadline,
              const TensorView& data, size_t chunkBytes)
      : CollectiveOp(comm, sig, deadline), data_(data) {
    const int n = comm.size();
    root_ = static_cast<int>(sig.root);
    pos_ = (comm.rank() - root_ + n) % n;
    chain_ = sig.algorithm == Algorithm::kChain;
    const size_t bytes = data.bytes();
    const size_t es = dtypeSize(data.dtype);
    chunkElems_ = std::max<size_t>(1, chunkBytes / es);
    k_ = chain_ ? static_cast<uint32_t>(std::max<size_t>(1, (data.count + chunkElems_ - 1) /
                                                                chunkElems_))
                : 1;
    if (!chain_) chunkElems_ = std::max<size_t>(1, data.count);
    (void)bytes;
  }

 protected:
  void begin() override {
    const int n = size();
    if (n == 1) {
      finish();
      return;
    }
    if (!chain_) {
      if (pos_ == 0) {
        for (int i = 1; i < n; ++i) sendTo((root_ + i) % n, 0, data_.data, data_.bytes());
        finish();
      } else {
        recvFrom(root_, 0, data_.data, data_.bytes());
      }
      return;
    }
    if (pos_ == 0) {
      for (uint32_t j = 0; j < k_; ++j) sendTo(next(), j, chunk(j), chunkBytes(j));
      finish();
      return;
    }
    // Every chunk goes straight into its place: post all receives at once.
    for (uint32_t j = 0; j < k_; ++j) recvFrom(prev(), j, chunk(j), chunkBytes(j));
  }

  void onReceived(int, uint32_t j) override {
    if (chain_ && pos_ < size() - 1) sendTo(next(), j, chunk(j), chunkBytes(j));
    if (++received_ == k_) finish();
  }

  uint32_t messagesFrom(int) const override { return k_; }
  uint32_t messagesTo(int) const override { return k_; }

 private:
  int next() const { return (rank() + 1) % size(); }
  int prev() const { return (rank() + size() - 1) % size(); }
  uint8_t* chunk(uint32_t j) const {
    return static_cast<uint8_t*>(data_.data) + j * chunkElems_ * dtypeSize(data_.dtype);
  }
  size_t chunkBytes(uint32_t j) const {
    const size_t start = static_cast<size_t>(j) * chunkElems_;
    const size_t end = std::min(data_.count, start + chunkElems_);
    return (end > start ? end - start : 0) * dtypeSize(data_.dtype);
  }

  const TensorView data_;
  int root_ = 0, pos_ = 0;
  bool chain_ = false;
  size_t chunkElems_ = 1;
  uint32_t k_ = 1;
  uint32_t received_ = 0;
};

class P2pOp final : public CollectiveOp {
 public:
  P2pOp(Communicator& comm, const OpSignature& sig, Deadline deadline, const TensorView& data,
        bool sending)
      : CollectiveOp(comm, sig, deadline), data_(data), sending_(sending) {
    k_ = static_cast<uint32_t>(
        std::max<size_t>(1, (data.bytes() + kP2pMessageBytes - 1) / kP2pMessageBytes));
  }

 protected:
  void begin() override {
    const int peer = signature().peer;
    for (uint32_t j = 0; j < k_; ++j) {
      const size_t start = static_cast<size_t>(j) * kP2pMessageBytes;
      const size_t len = std::min(kP2pMessageBytes, data_.bytes() - std::min(data_.bytes(), start));
      uint8_t* p = static_cast<uint8_t*>(data_.data) + start;
      if (sending_) {
        sendTo(peer, j, p, len);
      } else {
        recvFrom(peer, j, p, len);
      }
    }
    if (sending_) finish();
  }
  void onReceived(int, uint32_t) override {
    if (++received_ == k_) finish();
  }
  bool leavesQueueWhenPosted() const override { return true; }
  uint32_t messagesFrom(int) const override { return k_; }
  uint32_t messagesTo(int) const override { return k_; }

 private:
  const TensorView data_;
  const bool sending_;
  uint32_t k_ = 1;
  uint32_t received_ = 0;
};

}  // namespace

std::shared_ptr<CollectiveOp> makeDirectAllreduce(Communicator& comm, const OpSignature& sig,
                                                  Deadline deadline, const TensorView& in,
                                                  const TensorView& out) {
  return std::make_shared<ExchangeOp>(comm, sig, deadline, ExchangeOp::Kind::kAllreduce, in, out);
}

std::shared_ptr<CollectiveOp> makeDirectAllgather(Communicator& comm, const OpSignature& sig,
                                                  Deadline deadline, const TensorView& in,
                                                  const TensorView& out) {
  return std::make_shared<ExchangeOp>(comm, sig, deadline, ExchangeOp::Kind::kAllgather, in, out);
}

std::shared_ptr<CollectiveOp> makeBarrier(Communicator& comm, const OpSignature& sig,
                                          Deadline deadline) {
  return std::make_shared<ExchangeOp>(comm, sig, deadline, ExchangeOp::Kind::kBarrier,
                                      TensorView(), TensorView());
}

std::shared_ptr<CollectiveOp> makeBroadcast(Communicator& comm, const OpSignature& sig,
                                            Deadline deadline, const TensorView& data,
                                            size_t chunkBytes) {
  return std::make_shared<BroadcastOp>(comm, sig, deadline, data, chunkBytes);
}

std::shared_ptr<CollectiveOp> makeP2p(Communicator& comm, const OpSignature& sig,
                                      Deadline deadline, const TensorView& data, bool sending) {
  return std::make_shared<P2pOp>(comm, sig, deadline, data, sending);
}

}  // namespace cofab::comm
