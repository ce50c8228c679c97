// RawPeer: a hand-driven connection to a daemon for protocol tests — sends arbitrary headers
// (as any peer id) and reads the daemon's answers one by one, with deadlines.
#pragma once

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/registry.h"

namespace cofab::testing {

struct RawMessage {
  wire::Header header;
  std::vector<uint8_t> payload;
  bool isReject(ps::RejectReason r) const {
    return header.type == wire::MessageType::kControl &&
           header.opcode == static_cast<uint8_t>(ps::ControlOp::kReject) && !payload.empty() &&
           payload[0] == static_cast<uint8_t>(r);
  }
  bool isControl(ps::ControlOp op) const {
    return header.type == wire::MessageType::kControl && header.opcode == static_cast<uint8_t>(op);
  }
  std::string text() const {
    return payload.empty() ? "" : std::string(payload.begin() + 1, payload.end());
  }
};

class RawPeer {
 public:
  static StatusOr<std::unique_ptr<RawPeer>> connect(const std::string& address,
                                                    const std::string& id) {
    auto p = std::unique_ptr<RawPeer>(new RawPeer);
    COFAB_ASSIGN_OR_RETURN(p->ctx_, transport::Registry::create("tcp", {}));
    transport::ConnectOptions co;
    co.localId = id;
    COFAB_ASSIGN_OR_RETURN(p->conn_, p->ctx_->connect(address, co, Deadline::afterMs(10000)));
    return p;
  }
  ~RawPeer() {
    if (ctx_) {
      ctx_->close();
      ctx_->join();
    }
  }

  static wire::Header push(uint32_t rank, uint64_t key, uint64_t iteration, DType dtype,
                           uint32_t chunkCount = 1, uint8_t bits = ps::kPushDeliver) {
    wire::Header h;
    h.type = wire::MessageType::kPush;
    h.senderRank = rank;
    h.key = key;
    h.iteration = iteration;
    h.dtype = dtype;
    h.chunkCount = chunkCount;
    h.opcode = bits;
    return h;
  }

  // A control request (model store, fan-out release, ...) for chunk 0 of 1 of `key`.
  static wire::Header control(ps::ControlOp op, uint32_t rank, uint64_t key, DType dtype,
                              uint64_t iteration = 0) {
    wire::Header h;
    h.type = wire::MessageType::kControl;
    h.opcode = static_cast<uint8_t>(op);
    h.senderRank = rank;
    h.key = key;
    h.iteration = iteration;
    h.dtype = dtype;
    h.chunkCount = 1;
    return h;
  }

  // A send that has not completed by the deadline closes the connection and waits for the
  // cancellation before returning: the transport may still be reading `payload`, which the
  // caller frees when this returns.
  Status send(const wire::Header& h, const std::vector<uint8_t>& payload,
              int64_t timeoutMs = 10000) {
    auto done = std::make_shared<std::promise<Status>>();
    auto f = done->get_future();
    conn_->send(h, payload.data(), payload.size(), [done](const Status& s) { done->set_value(s); });
    if (f.wait_for(std::chrono::milliseconds(timeoutMs)) != std::future_status::ready) {
      conn_->close();
      f.wait();
      return DeadlineExceeded("send of " + std::to_string(payload.size()) + " bytes: not done in " +
                              std::to_string(timeoutMs) + " ms; connection closed");
    }
    return f.get();
  }
  template <typename T>
  Status sendValues(const wire::Header& h, const std::vector<T>& values) {
    const auto* b = reinterpret_cast<const uint8_t*>(values.data());
    return send(h, std::vector<uint8_t>(b, b + values.size() * sizeof(T)));
  }

  StatusOr<RawMessage> recv(int64_t timeoutMs = 10000) {
    auto done = std::make_shared<std::promise<StatusOr<RawMessage>>>();
    auto f = done->get_future();
    conn_->recvOwned([done](const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) {
      if (!s.ok()) {
        done->set_value(s);
        return;
      }
      done->set_value(RawMessage{h, std::move(p)});
    });
    if (f.wait_for(std::chrono::milliseconds(timeoutMs)) != std::future_status::ready) {
      return DeadlineExceeded("no message from the daemon");
    }
    return f.get();
  }

  // Reads until a message that is not an ack (acks are expected, results/rejects are checked).
  StatusOr<RawMessage> recvSkippingAcks() {
    for (;;) {
      COFAB_ASSIGN_OR_RETURN(RawMessage m, recv());
      if (!m.isControl(ps::ControlOp::kAck)) return m;
    }
  }

  // The next result (acks skipped) as f32 values; an error naming whatever came instead.
  StatusOr<std::vector<float>> recvResult() {
    COFAB_ASSIGN_OR_RETURN(RawMessage m, recvSkippingAcks());
    if (m.header.type != wire::MessageType::kPullReply) {
      return FailedPrecondition("expected a result, got " + m.header.describe() + " " + m.text());
    }
    std::vector<float> v(m.payload.size() / sizeof(float));
    std::memcpy(v.data(), m.payload.data(), v.size() * sizeof(float));
    return v;
  }

 private:
  RawPeer() = default;
  std::shared_ptr<transport::Context> ctx_;
  std::shared_ptr<transport::Connection> conn_;
};

}  // namespace cofab::testing
