// Endpoint: one end of an rdma connection — an RC queue pair, its completion queue, receive
// slots the peer writes into, staging slots this side writes from, and the protocol state
// (credits, message assembly, orderly close). Internal to fabric/transport/rdma; users see it
// through RdmaConnection (the Connection contract, fabric/transport/connection.h).
//
// Protocol. A message is its 64-byte wire header followed by the payload, cut into chunks of at
// most slotBytes; each message starts a new chunk. A chunk is copied into the staging slot with
// the same index as the peer's next receive slot and sent as RDMA WRITE WITH IMMEDIATE (the
// immediate is the slot index), which lands in that slot and consumes one of the peer's posted
// RECVs, telling it a chunk arrived (opcode IBV_WC_RECV_RDMA_WITH_IMM, byte_len = chunk length).
// Slots are a ring used in order on both sides. The sender holds one credit per free peer slot;
// the receiver returns credits in batches with a small SEND. Close sends a goodbye SEND after
// the data (RC keeps it ordered), so the peer delivers every chunk that preceded it and then
// reports the close. The TCP side channel that carried the set-up stays open: its end means
// the peer process went away.
//
// Threading: every method except the constructor-side set-up runs on the context's Worker
// thread; status() may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/transport/connection.h"
#include "fabric/transport/rdma/qp_info.h"
#include "fabric/transport/rdma/rdma_device.h"
#include "fabric/transport/rdma/rdma_memory_region.h"
#include "fabric/transport/rdma/rdma_worker.h"

namespace cofab::transport::rdma {

struct EndpointOptions {
  uint32_t slots = 32;
  uint32_t slotBytes = 64 * 1024;
  uint64_t maxPayload = wire::kDefaultMaxPayload;
};

class Endpoint : public Pollable, public std::enable_shared_from_this<Endpoint> {
 public:
  // Creates the CQ, the QP (RESET→INIT), registers the slots and posts the RECVs. Any thread.
  static StatusOr<std::shared_ptr<Endpoint>> create(std::shared_ptr<RdmaDevice> device,
                                                    std::shared_ptr<Worker> worker,
                                                    const EndpointOptions& options);
  ~Endpoint() override;

  // What this side tells the peer.
  QpInfo localInfo() const;
  // INIT→RTR→RTS towards the peer. Any thread, before start().
  Status connectQp(const QpInfo& remote);
  // Names the peer and hands the endpoint to the worker; `sideChannel` is kept for liveness.
  void start(std::string peerId, std::string peerAddress, std::shared_ptr<Connection> sideChannel);

  // The Connection operations (called through RdmaConnection; they post to the worker).
  void send(const wire::Header& header, ConstSlices payload, SendCallback done);
  void recv(MutableSlices dest, RecvCallback done);
  void recvOwned(RecvOwnedCallback done);
  void close();
  Status status() const;
  const std::string& peerId() const { return peerId_; }
  const std::string& peerAddress() const { return peerAddress_; }
  std::string describe() const;

  // Pollable (worker thread).
  bool poll() override;
  bool finished() const override { return finished_; }
  void shutdown() override;

  // Releases the verbs resources of an endpoint that never started (set-up failed).
  void abandon();

 private:
  // The connection's own error, without the pending close status() reports.
  Status stickyError() const;
  struct SendOp {
    wire::EncodedHeader header;
    std::vector<ConstSlice> slices;
    uint64_t total = 0;   // header + payload bytes
    uint64_t posted = 0;  // bytes handed to the QP so far
    size_t slice = 0;     // copy cursor: slice index and offset in it (-1 slice: the header)
    size_t sliceOffset = 0;
    uint32_t inFlight = 0;  // chunks posted, not yet completed
    // Set when the send failed validation: it posts nothing and completes with this status in
    // its turn, after the sends posted before it (callbacks in posting order).
    Status error;
    SendCallback done;
  };
  struct RecvOp {
    bool owned = false;
    // Set when the receive failed validation: it consumes no message and completes with this
    // status in its turn, after the receives posted before it.
    Status error;
    std::vector<MutableSlice> dest;
    size_t expected = 0;
    RecvCallback done;
    RecvOwnedCallback ownedDone;
    // Assembly state once the message's header arrived.
    bool started = false;
    wire::Header header;
    std::vector<uint8_t> payload;  // owned receives
    uint64_t copied = 0;
    size_t slice = 0;
    size_t sliceOffset = 0;
    uint32_t crc = 0;
  };
  struct Chunk {
    uint32_t slot;
    uint32_t length;
  };

  Endpoint(std::shared_ptr<RdmaDevice> device, std::shared_ptr<Worker> worker,
           const EndpointOptions& options);
  Status init();

  // Worker thread.
  void doSend(std::shared_ptr<SendOp> op);
  void doRecv(RecvOp op);
  void doClose(Status why);
  void pumpSends();
  void processRecvs();
  void returnCredits(bool force);
  bool postControl(uint32_t type, uint32_t value);
  Status postRecvBuffer(uint32_t index);
  void handleCompletion(const ibv_wc& wc);
  void completeSends();
  std::deque<std::shared_ptr<SendOp>> takeSends();
  void fail(const Status& s);
  void peerGone(const Status& s);
  void finishRecv(RecvOp& op, const Status& s);
  void teardown();
  void releaseVerbs();
  // The side channel ended (s: why), or brought the peer's failure (`peerFailure`: its reason).
  void onSideChannelEnd(const Status& s, const std::string& peerFailure = "");
  Status wcError(const ibv_wc& wc, const char* what) const;

  const std::shared_ptr<RdmaDevice> device_;
  const VerbsApi& verbs_;
  const std::shared_ptr<Worker> worker_;
  const EndpointOptions options_;
  std::string peerId_;
  std::string peerAddress_;
  std::shared_ptr<Connection> side_;

  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  QpInfo remote_;
  uint32_t ctrlRecvCount_ = 0;  // RECVs kept posted (data chunks and control messages)
  uint32_t ctrlSendCount_ = 0;
  std::vector<uint8_t> recvSlots_;   // peer writes here
  std::vector<uint8_t> stageSlots_;  // copied from, written to the peer
  std::vector<uint8_t> ctrlRecv_;    // 16 bytes per posted RECV
  std::vector<uint8_t> ctrlSend_;    // 16 bytes per control SEND in flight
  std::unique_ptr<RdmaMemoryRegion> recvMr_, stageMr_, ctrlRecvMr_, ctrlSendMr_;

  // Worker-thread state.
  bool started_ = false;
  bool closed_ = false;    // close() ran: no more operations
  bool closing_ = false;   // waiting for the goodbye SEND to complete before teardown
  bool finished_ = false;  // resources released
  int64_t goodbyeDeadlineNs_ = 0;
  uint32_t credits_ = 0;     // free peer slots
  uint64_t chunksSent_ = 0;  // next peer slot = chunksSent_ % remote_.slotCount
  std::vector<bool> stageBusy_;
  std::vector<bool> ctrlSendBusy_;
  uint32_t ctrlSendNext_ = 0;
  std::deque<std::shared_ptr<SendOp>> sends_;  // in post order until their callback ran
  // The op whose chunk occupies each stage slot; null once that op was failed (takeSends()) while
  // the chunk's WRITE is still outstanding.
  std::vector<SendOp*> stageOp_;
  uint32_t goodbyeIndex_ = UINT32_MAX;  // control buffer of the goodbye, once posted
  bool goodbyeDone_ = false;
  uint64_t chunkOffset_ = 0;  // read position in arrived_.front()
  std::deque<RecvOp> recvOps_;
  std::deque<Chunk> arrived_;
  uint64_t chunksArrived_ = 0;
  uint32_t freedSinceCredit_ = 0;
  Status peerClosed_;  // set when the peer said goodbye or vanished; reported after the data
  bool goodbyeSeen_ = false;

  mutable std::mutex statusMu_;
  Status status_;  // sticky
  // close() was called: status() says Cancelled before the worker runs the close (which must
  // still see status_ OK to say its orderly goodbye).
  bool appClosed_ = false;  // under statusMu_
  Status peerGoneSeen_;     // under statusMu_: peerClosed_ for status(), from the moment it is set
  // Under statusMu_: the peer was gone before the first sticky error (our close's Cancelled):
  // status() goes on reporting the peer's going, the first error.
  bool peerGoneFirst_ = false;
};

}  // namespace cofab::transport::rdma
